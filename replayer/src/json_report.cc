// The JSON report. Its schema is replayer/SCHEMA.md: change both together, and bump
// kSchemaVersion for anything but an added field.
#include <nlohmann/json.hpp>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

using nlohmann::json;

json UserFrameJson(const std::optional<UserFrame>& frame) {
  if (!frame) return nullptr;
  return {{"file", frame->file}, {"line", frame->line}, {"function", frame->function}};
}

json OpJson(const OpRef& op) {
  json stack = json::array();
  for (const Frame& f : op.stack) {
    json generated = nullptr;
    if (!f.generated_file.empty()) {
      generated = {{"file", f.generated_file},
                   {"line", f.generated_line},
                   {"function", f.generated_function}};
    }
    stack.push_back({{"function", f.function},
                     {"file", f.file},
                     {"line", f.line},
                     {"library", f.library},
                     {"python", f.python},
                     {"framework", f.framework},
                     {"generated", std::move(generated)}});
  }
  return {{"id", op.id},
          {"op", op.name.empty() ? json(nullptr) : json(op.name)},
          {"overload", op.overload},
          {"detail", op.detail.empty() ? json(nullptr) : json(op.detail)},
          {"thread", op.thread},
          {"user_frame", UserFrameJson(op.user_frame)},
          {"stack", std::move(stack)},
          {"module", op.module.empty() ? json(nullptr) : json(op.module)},
          {"hook", op.hook},
          {"function", op.function.empty()
                           ? json(nullptr)
                           : json({{"name", op.function},
                                   {"backward", op.in_function_backward},
                                   {"called_from", UserFrameJson(op.called_from)}})}};
}

json OptionalOpJson(const std::optional<OpRef>& op) { return op ? OpJson(*op) : json(nullptr); }

// 64-bit hashes as "0x" + 16 hex digits: JSON numbers lose bits past 2^53 in most readers.
std::string Hex64(uint64_t value) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s = "0x0000000000000000";
  for (int i = 17; i >= 2; --i, value >>= 4) s[i] = kDigits[value & 15];
  return s;
}

json NodeJson(const NodeRef& node) {
  return {{"id", node.id},
          {"name", node.name},
          {"sequence_nr", node.sequence_nr},
          {"forward_thread", node.forward_thread}};
}

// kCounterReset's evidence: {"from", "to", "before": Op, "after": Op}.
json CounterResetJson(const std::optional<CounterReset>& reset) {
  if (!reset) return nullptr;
  return {{"from", reset->from},
          {"to", reset->to},
          {"before", OpJson(reset->before)},
          {"after", OpJson(reset->after)}};
}

// What an unpack hook returned unlike the saved tensor: {"dtype", "shape", "saved_dtype",
// "saved_shape"}.
json UnpackedJson(const std::optional<UnpackedRef>& unpacked) {
  if (!unpacked) return nullptr;
  return {{"dtype", unpacked->dtype},
          {"shape", unpacked->shape},
          {"saved_dtype", unpacked->saved_dtype},
          {"saved_shape", unpacked->saved_shape}};
}

json TensorJson(const SavedTensorRef& t) {
  return {{"id", t.id},
          {"name", t.saved_name},
          {"list_index", t.list_index == format::TensorUse::kNotInList ? json(nullptr)
                                                                        : json(t.list_index)},
          {"shape", t.shape},
          {"dtype", t.dtype.empty() ? json(nullptr) : json(t.dtype)},
          {"device", t.device.empty() ? json(nullptr) : json(t.device)},
          {"storage", t.storage},
          {"version_counter", t.version_counter},
          {"is_output", t.is_output},
          {"is_leaf", t.is_leaf},
          {"output_nr", t.output_nr},
          {"inner", t.inner == 0 ? json(nullptr) : json(t.inner)}};
}

json ViolationJson(const Violation& v) {
  json later = json::array();
  for (const OpRef& op : v.later_culprits) later.push_back(OpJson(op));
  json candidates = json::array();
  for (const SilentCandidate& c : v.candidates) {
    json op = OpJson(c.op);
    op["role"] = c.wrote ? "wrote" : "aliased";
    candidates.push_back(std::move(op));
  }
  json kernels = json::array();
  for (const KernelRef& k : v.kernels) {
    kernels.push_back({{"name", k.name}, {"device", k.device}, {"start_ns", k.start_ns},
                       {"end_ns", k.end_ns}});
  }
  return {
      {"kind", ViolationKindName(v.kind)},
      {"culprit", OptionalOpJson(v.culprit)},
      {"later_culprits", std::move(later)},
      {"victim", OptionalOpJson(v.victim)},
      {"backward_node", NodeJson(v.backward_node)},
      {"recomputing", v.recomputing ? NodeJson(*v.recomputing) : json(nullptr)},
      {"recomputed", v.recomputed},
      {"read_by_recompute", v.read_by_recompute},
      {"saved_version", v.saved_version},
      {"current_version", v.current_version},
      {"tensor", TensorJson(v.tensor)},
      {"pytorch_raised", v.pytorch_raised},
      {"pytorch_message", v.pytorch_message ? json(*v.pytorch_message) : json(nullptr)},
      {"pytorch_names", v.pytorch_names ? json(*v.pytorch_names) : json(nullptr)},
      {"simulated", v.simulated},
      {"backward_pass", v.backward_pass},
      {"step", v.step ? json(*v.step) : json(nullptr)},
      {"node_exec_op", v.node_exec_op == 0 ? json(nullptr) : json(v.node_exec_op)},
      {"evidence", v.kind == ViolationKind::kSilent ? json(SilentEvidenceName(v.evidence))
                                                    : json(nullptr)},
      {"fingerprint", v.fingerprint ? json({{"at_save", Hex64(v.fingerprint->at_save)},
                                            {"at_use", Hex64(v.fingerprint->at_use)}})
                                    : json(nullptr)},
      {"candidates", std::move(candidates)},
      {"kernels", std::move(kernels)},
      {"recording_incomplete", v.recording_incomplete},
      {"counter_reset", CounterResetJson(v.counter_reset)},
      {"changed_source", OptionalOpJson(v.changed_source)},
      {"freed_by_pass", v.freed_by_pass ? json(*v.freed_by_pass) : json(nullptr)},
      {"unpacked", UnpackedJson(v.unpacked)},
  };
}

// Backward functions that threw with no violation to explain it: [{"backward_op", "message"}].
json UnexplainedErrorsJson(const Report& report) {
  json errors = json::array();
  for (const UnexplainedError& e : report.unexplained_errors) {
    errors.push_back({{"backward_op", OpJson(e.backward_op)},
                      {"message", e.message.empty() ? json(nullptr) : json(e.message)}});
  }
  return errors;
}

// Hidden writes that put back the saved bytes: {"count", "listed": [{"backward_node", "tensor",
// "writer", "backward_pass"}]}, the first few of `count`.
json RestoredWritesJson(const Report& report) {
  json listed = json::array();
  for (const RestoredWrite& w : report.restored) {
    listed.push_back({{"backward_node", NodeJson(w.backward_node)},
                      {"tensor", TensorJson(w.tensor)},
                      {"writer", OpJson(w.writer)},
                      {"backward_pass", w.backward_pass}});
  }
  return {{"count", report.restored_count}, {"listed", std::move(listed)}};
}

// The program's own error: {"type", "message", "op"} (op null when no recorded op raised it);
// null when there is none to report.
json ProgramErrorJson(const Report& report) {
  if (!report.program_error) return nullptr;
  const ProgramError& e = *report.program_error;
  return {{"type", e.type},
          {"message", e.message},
          {"op", e.op.id == 0 ? json(nullptr) : OpJson(e.op)}};
}

// Where the gradient stopped: [{"cause", "raised", "op", "checkpoint", "loss", "message",
// "parameters": [{"id", "name", "module", "shape"}], "parameter_count", "summary",
// "backward_passes", "help"}].
json GradientCutsJson(const Report& report) {
  json cuts = json::array();
  for (const GradientCut& cut : report.gradient_cuts) {
    json parameters = json::array();
    for (const CutParameter& p : cut.parameters) {
      parameters.push_back(
          {{"id", p.id}, {"name", p.name}, {"module", p.module}, {"shape", p.shape}});
    }
    cuts.push_back({{"cause", CutCauseName(cut.cause)},
                    {"raised", cut.raised},
                    {"op", OptionalOpJson(cut.op)},
                    {"checkpoint", OptionalOpJson(cut.checkpoint)},
                    {"loss", OptionalOpJson(cut.loss)},
                    {"message", cut.pytorch_message.empty() ? json(nullptr)
                                                            : json(cut.pytorch_message)},
                    {"parameters", std::move(parameters)},
                    {"parameter_count", cut.parameter_count},
                    {"summary", cut.summary},
                    {"backward_passes", cut.backward_passes},
                    {"help", cut.help}});
  }
  return cuts;
}

// The first NaN or Inf: {"cause", "nan", "op", "backward", "forward", "became_nan", "dtype",
// "dtype_max", "input_max_abs", "step", "reached", "later_ops", "steps", "help"}, or null.
json NonFiniteJson(const Report& report) {
  if (!report.non_finite) return nullptr;
  const NonFinite& n = *report.non_finite;
  return {{"cause", NonFiniteCauseName(n.cause)},
          {"nan", n.nan},
          {"op", n.op.id == 0 ? json(nullptr) : OpJson(n.op)},
          {"backward", n.backward},
          {"forward", OptionalOpJson(n.forward)},
          {"became_nan", OptionalOpJson(n.became_nan)},
          {"dtype", n.dtype},
          {"dtype_max", n.dtype_max},
          {"input_max_abs", n.input_max_abs},
          {"step", n.step == UINT64_MAX ? json(nullptr) : json(n.step)},
          {"reached", n.reached},
          {"later_ops", n.later_ops},
          {"steps", n.steps},
          {"help", n.help}};
}

// The violations that are one diagnostic: [{"violations": [index, ...], "count", "steps"}].
json GroupsJson(const Report& report) {
  json groups = json::array();
  for (const ViolationGroup& group : report.groups) {
    groups.push_back({{"violations", group.violations},
                      {"count", group.violations.size()},
                      {"steps", group.steps},
                      {"modules", group.modules}});
  }
  return groups;
}

// Whether the recording covers the whole run: {"complete", "stopped", "records_lost"}.
json RecordingJson(const Report& report) {
  json stopped = nullptr;
  if (report.recording_stopped) {
    const RecordingStop& stop = *report.recording_stopped;
    stopped = {{"op", stop.op == 0 ? json(nullptr) : json(stop.op)},
               {"thread", stop.thread},
               {"time_ns", stop.time_ns},
               {"message", stop.message}};
  }
  json steps = nullptr;
  if (report.steps != 0) {
    steps = {{"first", report.first_step}, {"last", report.last_step}, {"count", report.steps},
             {"window", report.window()}};
  }
  return {{"complete", !report.incomplete()},
          {"empty", report.ops == 0},
          {"stopped", std::move(stopped)},
          {"records_lost", report.records_lost},
          {"steps", std::move(steps)}};
}

}  // namespace

nlohmann::json ToJson(const Report& report) {
  json violations = json::array();
  for (const Violation& v : report.violations) violations.push_back(ViolationJson(v));
  return {{"schema_version", kSchemaVersion},
          {"violations", std::move(violations)},
          {"groups", GroupsJson(report)},
          {"ops", report.ops},
          {"records", report.records},
          {"tensors", report.tensors},
          {"nodes", report.nodes},
          {"node_executions", report.node_executions},
          {"backward_passes", report.backward_passes},
          {"compile_passes", report.compile_passes},
          {"version_bumps", report.version_bumps},
          {"data_loss_records", report.data_loss_records},
          {"recording", RecordingJson(report)},
          {"unexplained_errors", UnexplainedErrorsJson(report)},
          {"program_error", ProgramErrorJson(report)},
          {"restored_writes", RestoredWritesJson(report)},
          {"gradient_cuts", GradientCutsJson(report)},
          {"non_finite", NonFiniteJson(report)},
          {"scaler_skipped_steps", report.scaler_skipped_steps},
          {"ranges_recorded", report.ranges_recorded},
          {"warnings", report.warnings}};
}

}  // namespace torchrr::replayer
