// The SARIF 2.1.0 log (editor_formats.h), as OASIS's schema describes it
// (tests/python/data/sarif-schema-2.1.0.json checks it).
#include <filesystem>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "render/diagnostics.h"
#include "torchrr/replayer/editor_formats.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {
namespace {

using nlohmann::json;

// One reportingDescriptor per rule: what the code-scanning view shows beside each result.
struct Rule {
  const char* id;  // ViolationKindName, or the errors' rules (diagnostics.h).
  const char* name;
  const char* short_description;
  const char* full_description;
  const char* help;
};

constexpr Rule kRules[] = {
    {"version", "SavedTensorModifiedInPlace",
     "A tensor autograd saved for backward was modified in place.",
     "An op modified in place a tensor that autograd saved for backward: its version counter "
     "moved between the save and backward's use, and PyTorch raises (or would have) \"one of "
     "the variables needed for gradient computation has been modified by an inplace operation\".",
     "Make the in-place op out of place, or .clone() the tensor before modifying it."},
    {"silent", "SavedTensorChangedSilently",
     "A tensor autograd saved for backward changed where PyTorch cannot see it.",
     "The saved tensor's bytes changed between the save and backward's use without its version "
     "counter showing it (a write through .data or another alias, a counter set back, a storage "
     "replaced, a hook's cast): PyTorch raises nothing and the gradient is silently wrong.",
     "Write through the tensor itself, or .clone() the tensor before writing into it."},
    {"detached", "SavedTensorDetachedInPlace",
     "A tensor autograd saved for backward was detached in place.",
     "detach_() cut a saved input from its graph: PyTorch raises when backward unpacks it.",
     "Use out-of-place .detach(), which leaves the saved tensor in its graph."},
    {"freed", "SavedTensorUsedAfterFree",
     "Backward used a saved tensor an earlier backward pass had freed.",
     "An earlier backward pass ran the node and freed what it saved: PyTorch raises \"Trying to "
     "backward through the graph a second time\".",
     "Pass retain_graph=True to the earlier backward(), or run forward again."},
    {"unpack_hook", "UnpackHookTensorRejected",
     "Backward failed on the tensor a saved_tensors_hooks unpack hook returned.",
     "A saved_tensors_hooks unpack hook handed backward a tensor it failed on; PyTorch checks "
     "nothing of what the hook returns.",
     "Make the unpack hook return a tensor of the saved one's shape, dtype and device."},
    {"cached_mutated", "CheckpointCacheModified",
     "An output selective activation checkpointing cached was modified before recomputation.",
     "Selective activation checkpointing cached an op's output in forward, and it was modified "
     "in place before backward's recomputation: PyTorch raises.",
     "Clone the op's output before modifying it, or let the policy recompute that op."},
    {kUnexplainedErrorRule, "UnexplainedBackwardError",
     "Backward raised an error no modified saved tensor explains.",
     "A backward function raised an error that no violation torchrr found accounts for: the "
     "trace cannot say which op caused it.",
     "Read PyTorch's message; torchrr replay prints the node and its op."},
    {kProgramErrorRule, "UnexplainedProgramError",
     "The program ended with an error that is not about saved tensors.",
     "The recorded program raised an error that no violation explains, of a kind torchrr does "
     "not follow (an error in forward, a data error).",
     "Read the program's error; torchrr has no verdict on it."},
    {kGradientCutRule, "GradientCut",
     "The gradient stopped between trainable parameters and the loss.",
     "Backward raised that the loss does not require grad, or trainable parameters got no "
     "gradient from a backward that ran: an op on their path to the loss cut it (no_grad, "
     "inference_mode, detach, .item(), NumPy, a reentrant checkpoint whose inputs do not "
     "require grad, a kernel without backward).",
     "Follow the help of the result: run that part with gradients, or for a reentrant "
     "checkpoint call enable_input_require_grads() or use use_reentrant=False."},
    {kNonFiniteRule, "NonFinite",
     "A NaN or Inf reached the loss, a gradient or a weight.",
     "The first op, in the order the ops ran, that made a NaN or an Inf from finite inputs and "
     "whose value reached the loss, a gradient or a weight: an overflow in half precision, log, "
     "sqrt or a division at zero, a softmax over a fully masked row, torch.where's untaken "
     "branch in backward, data that held it, an optimizer's update.",
     "Follow the help of the result: upcast, clamp into the domain, mask with a finite value, "
     "make the untaken branch safe."},
};

// `path` as a URI reference: RFC 3986's unreserved characters and '/' kept, every other byte
// percent-encoded, so that spaces, '#', '%' and non-ASCII bytes cannot break the reference.
std::string PercentEncoded(const std::string& path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

// An artifactLocation for a file as the trace records it: an absolute path as a file:// URI; a
// relative one (Python names a script run from its directory that way) stays relative, against
// "SRCROOT", which SARIF leaves to the consumer (code scanning: the repository's root), as the
// trace does not say where the program ran.
json SourceArtifact(const std::string& file) {
  if (file.starts_with('/')) return {{"uri", "file://" + PercentEncoded(file)}};
  return {{"uri", PercentEncoded(file)}, {"uriBaseId", "SRCROOT"}};
}

// The trace itself, where a diagnostic without a line of code and a read's problems are placed:
// absolute, since a relative path is relative to where replay ran.
json TraceArtifact(const std::string& path) {
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return {{"uri", "file://" + PercentEncoded(error ? path : absolute.lexically_normal().string())}};
}

json PhysicalLocation(const DiagnosticPlace& place) {
  json location = {{"artifactLocation", SourceArtifact(place.file)}};
  if (place.line != 0) {
    location["region"] = {{"startLine", place.line}, {"startColumn", place.column}};
  }
  return location;
}

size_t RuleIndex(const std::string& id) {
  for (size_t i = 0; i < std::size(kRules); ++i) {
    if (id == kRules[i].id) return i;
  }
  return std::size(kRules);  // Never: every rule a diagnostic names is in the table.
}

json RulesJson() {
  json rules = json::array();
  for (const Rule& rule : kRules) {
    rules.push_back({{"id", rule.id},
                     {"name", rule.name},
                     {"shortDescription", {{"text", rule.short_description}}},
                     {"fullDescription", {{"text", rule.full_description}}},
                     {"help", {{"text", rule.help}}},
                     {"defaultConfiguration", {{"level", "error"}}}});
  }
  return rules;
}

json ResultJson(const Diagnostic& d, const std::vector<ReplayedTrace>& traces) {
  json result = {{"ruleId", d.rule},
                 {"ruleIndex", RuleIndex(d.rule)},
                 {"level", "error"},
                 {"message", {{"text", d.message}}}};
  json physical = d.at ? PhysicalLocation(*d.at)
                       : json{{"artifactLocation", TraceArtifact(traces[d.traces.front()].path)}};
  result["locations"] = json::array({{{"physicalLocation", std::move(physical)}}});
  json related = json::array();
  if (d.victim_at) {
    related.push_back({{"id", 1},
                       {"physicalLocation", PhysicalLocation(*d.victim_at)},
                       {"message", {{"text", d.victim_message}}}});
  }
  if (!d.node.empty()) {
    const char* role = d.rule == kUnexplainedErrorRule ? "the backward node that raised"
                                                       : "the backward node that needed the tensor";
    related.push_back(
        {{"id", 2},
         {"logicalLocations", json::array({{{"name", d.node}, {"kind", "function"}}})},
         {"message", {{"text", role}}}});
  }
  if (!related.empty()) result["relatedLocations"] = std::move(related);
  json properties = {{"kind", d.rule}, {"count", d.count}, {"invocations", d.traces}};
  json ranks = json::array();
  for (size_t i : d.traces) {
    if (traces[i].rank >= 0) ranks.push_back(traces[i].rank);
  }
  if (!ranks.empty()) properties["ranks"] = std::move(ranks);
  if (!d.evidence.empty()) properties["evidence"] = d.evidence;
  if (!d.backward_passes.empty()) {
    properties["backward_pass"] = d.backward_passes.front();
    properties["backward_passes"] = d.backward_passes;
  }
  if (!d.node.empty()) properties["backward_node"] = d.node;
  if (!d.help.empty()) properties["help"] = d.help;
  properties["pytorch_raised"] = d.pytorch_raised;
  result["properties"] = std::move(properties);
  return result;
}

json Notification(const char* level, std::string text, const ReplayedTrace& trace) {
  json at = {{"physicalLocation", {{"artifactLocation", TraceArtifact(trace.path)}}}};
  return {{"level", level},
          {"message", {{"text", std::move(text)}}},
          {"locations", json::array({std::move(at)})}};
}

// One trace's invocation: whether it could be read, its exit code, and what limits its verdicts.
json InvocationJson(const ReplayedTrace& trace) {
  json notifications = json::array();
  const std::string message = trace.message.empty() ? "" : ": " + Printable(trace.message);
  if (!trace.report) {
    notifications.push_back(
        Notification("error", "trace not read (" + trace.status + ")" + message, trace));
  } else {
    const Report& report = *trace.report;
    if (trace.status != "ok") {
      notifications.push_back(Notification(
          "warning",
          "trace " + trace.status + ": analysed the records before the damage" + message, trace));
    }
    if (report.incomplete()) {
      notifications.push_back(Notification(
          "warning", "the recording is incomplete: a write or use it missed could change these "
                     "verdicts", trace));
    }
    if (report.ops == 0) {
      notifications.push_back(
          Notification("warning", "the trace holds no op, so it says nothing of the run", trace));
    }
    for (const std::string& warning : report.warnings) {
      notifications.push_back(Notification("warning", Printable(warning), trace));
    }
  }
  json properties = {{"trace", trace.path}, {"status", trace.status}};
  if (trace.rank >= 0) properties["rank"] = trace.rank;
  json invocation = {{"executionSuccessful", trace.report.has_value()},
                     {"exitCode", trace.exit_code},
                     {"properties", std::move(properties)}};
  if (!notifications.empty()) invocation["toolExecutionNotifications"] = std::move(notifications);
  return invocation;
}

}  // namespace

json ToSarif(const std::vector<ReplayedTrace>& traces, std::string_view tool_version) {
  std::vector<const Report*> reports;
  json invocations = json::array();
  for (const ReplayedTrace& trace : traces) {
    reports.push_back(trace.report ? &*trace.report : nullptr);
    invocations.push_back(InvocationJson(trace));
  }
  json results = json::array();
  for (const Diagnostic& d : CollectDiagnostics(reports)) results.push_back(ResultJson(d, traces));
  json driver = {{"name", "torchrr"},
                 {"fullName", "torchrr replay"},
                 {"version", std::string(tool_version)},
                 {"rules", RulesJson()}};
  json run = {{"tool", {{"driver", std::move(driver)}}},
              {"invocations", std::move(invocations)},
              {"results", std::move(results)}};
  return {{"$schema",
           "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
           "sarif-schema-2.1.0.json"},
          {"version", "2.1.0"},
          {"runs", json::array({std::move(run)})}};
}

}  // namespace torchrr::replayer
