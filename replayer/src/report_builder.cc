// What the analysis found, in the user's words; see report_builder.h.
#include "report_builder.h"
#include "gradient_cut.h"
#include "non_finite.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchrr::replayer {
namespace {

using format::InternId;
using format::ObjectId;
using format::OpScope;

// PyTorch's messages for the errors that came out of backward ops, by backward op.
using ExecMessages = std::unordered_map<ObjectId, std::string>;

// What PyTorch's messages say, by kind (torch/csrc/autograd/saved_variable.cpp).
constexpr std::string_view kVersionPhrase = "modified by an inplace operation";
constexpr std::string_view kDetachedPhrase = "saved tensor that has been detached";
constexpr std::string_view kFreedPhrase = "backward through the graph a second time";
// Non-reentrant checkpointing saves through hooks too; its own errors are about recomputation.
constexpr std::string_view kCheckpointPhrase = "torch.utils.checkpoint";
constexpr std::string_view kCachedMutatedPhrase =
    "cached during selective activation checkpoint has been mutated";

bool Says(const std::string& message, std::string_view phrase) {
  return message.find(phrase) != std::string::npos;
}

// Whether a message of PyTorch's is the error that `kind` makes it raise. An unpack hook's tensor
// fails in whatever the backward formula does with it: any message but the others' and
// checkpointing's.
bool MessageIsOf(ViolationKind kind, const std::string& message) {
  switch (kind) {
    case ViolationKind::kVersion: return Says(message, kVersionPhrase);
    case ViolationKind::kDetached: return Says(message, kDetachedPhrase);
    case ViolationKind::kFreed: return Says(message, kFreedPhrase);
    case ViolationKind::kCachedMutated: return Says(message, kCachedMutatedPhrase);
    case ViolationKind::kUnpackHook:
      return !Says(message, kVersionPhrase) && !Says(message, kDetachedPhrase) &&
             !Says(message, kFreedPhrase) && !Says(message, kCheckpointPhrase) &&
             !Says(message, kCachedMutatedPhrase);
    default: return false;
  }
}

// The Python frames through which autograd's backward() and grad() run a pass.
bool IsBackwardCallFrame(const Frame& f) {
  if (!f.python || !f.framework) return false;
  bool autograd_file = f.file.find("torch/autograd/") != std::string::npos ||
                       f.file.find("torch/_tensor.py") != std::string::npos;
  return autograd_file && (f.function == "backward" || f.function == "grad" ||
                           f.function == "Tensor.backward" || f.function.ends_with(".backward"));
}

// The first frame outside framework code; null for none.
const Frame* FirstUserFrameOf(const std::vector<Frame>& stack) {
  for (const Frame& f : stack) {
    if (IsUserFrame(f)) return &f;
  }
  return nullptr;
}

std::optional<UserFrame> FirstUserFrame(const std::vector<Frame>& stack) {
  const Frame* f = FirstUserFrameOf(stack);
  if (f == nullptr) return std::nullopt;
  return UserFrame{f->file, f->line, f->function};
}

std::string CopyKindName(format::CudaCopyKind kind) {
  switch (kind) {
    case format::CudaCopyKind::kHostToDevice: return "[memcpy HtoD]";
    case format::CudaCopyKind::kDeviceToHost: return "[memcpy DtoH]";
    case format::CudaCopyKind::kDeviceToDevice: return "[memcpy DtoD]";
    case format::CudaCopyKind::kMemset: return "[memset]";
    case format::CudaCopyKind::kPeer: return "[memcpy PtoP]";
    default: return "[memcpy]";
  }
}

// PyTorch's message: "... is at version 3; expected version 1 instead ..."
bool MessageMatches(const std::string& message, uint32_t current, uint32_t saved) {
  std::string expect = "is at version " + std::to_string(current) + "; expected version " +
                       std::to_string(saved) + " instead";
  return message.find(expect) != std::string::npos;
}

// Candidates for a silent write are listed once per op and call site: numpy() alone runs detach,
// to, resolve_conj...
bool SameCandidate(const OpRef& a, const OpRef& b) {
  return a.id == b.id || (a.name == b.name && a.user_frame && b.user_frame &&
                          a.user_frame->file == b.user_frame->file &&
                          a.user_frame->line == b.user_frame->line);
}

class ReportBuilder {
 public:
  explicit ReportBuilder(const AnalysisState& state)
      : state_(state), version_messages_(MessagesByBackwardOp(state.op_errors)),
        other_messages_(MessagesByBackwardOp(state.other_op_errors)) {
    SelectKept();
  }

  Report Build() const {
    Report report;
    report.records = state_.seq;
    report.ops = state_.op_count;
    report.tensors = state_.tensors.size();
    report.nodes = state_.nodes.size();
    report.node_executions = state_.exec_count;
    report.compile_passes = CountCompilePasses();
    report.backward_passes = state_.pass_count - report.compile_passes;
    report.version_bumps = state_.bump_count;
    report.data_loss_records = state_.data_loss_records;
    report.records_lost = state_.data_lost;
    report.recording_stopped = state_.recording_stopped;
    report.steps = state_.steps;
    report.first_step = state_.first_step;
    report.last_step = state_.last_step;
    AddViolations(report);
    for (Violation& v : report.violations) v.recording_incomplete = report.incomplete();
    report.groups = GroupViolations(report.violations);
    AddWarnings(report);
    AddUnexplainedErrors(report);
    AddGradientCuts(report);
    AddNonFinite(report);
    AddProgramError(report);
    AddRestored(report);
    return report;
  }

 private:
  std::vector<Frame> StackFrames(InternId stack) const;
  OpRef MakeOpRef(ObjectId id) const;
  uint64_t CountCompilePasses() const;
  OpRef UserOpRef(ObjectId innermost) const;
  // Whether `op`'s own user line is one that torch traced into a graph (a frame's origin): an op
  // torch.compile runs for that line, reported as itself rather than as the op around it (the
  // compiled region being run, which another region's compilation can nest in).
  bool RunsTracedUserLine(const OpInfo& op) const {
    std::vector<Frame> stack = StackFrames(op.stack);
    const Frame* user = FirstUserFrameOf(stack);
    return user != nullptr && !user->generated_file.empty();
  }
  // Whether `op` is a torch.compile'd region being run ("Torch-Compiled Region: 0/0", a range
  // around the compiled frame, whose stack has the line that called it). Regions nest (the frames
  // dynamo compiles after a graph break run inside the first one's): an op is reported as the
  // innermost region it ran in, the call the user made, not the outermost.
  bool IsCompiledRegion(const OpInfo& op) const {
    return state_.Str(op.name).starts_with("Torch-Compiled Region");
  }
  // Whether `op` is a Python autograd.Function's apply(): named by its class alone, where ATen's
  // and custom ops' names have a namespace, and neither a range nor autograd's engine wrapper.
  bool IsFunctionApply(const OpInfo& op) const {
    const std::string& name = state_.Str(op.name);
    return op.scope == OpScope::kFunction && name.find("::") == std::string::npos &&
           !IsAutogradEngineName(name) && !IsCompiledRegion(op);
  }
  void SetFunctionContext(ObjectId op, OpRef& ref) const;
  ObjectId BackwardOpOf(ObjectId op) const;
  ExecMessages MessagesByBackwardOp(
      const std::vector<std::pair<ObjectId, std::string>>& errors) const;
  const std::string* MessageOf(ObjectId exec_op, bool exec_threw, ViolationKind kind) const;
  bool ExecHas(ObjectId exec_op, ViolationKind kind) const;
  void SelectKept();
  bool IsNamedBy(const Finding& f, const std::string& message) const;
  std::optional<size_t> FindStopped() const;
  void AddViolations(Report& report) const;
  void AddPytorchOutcome(const Finding& f, bool stopped, Violation& v) const;
  void AddWarnings(Report& report) const;
  void AddUnexplainedErrors(Report& report) const;
  void AddProgramError(Report& report) const;
  void AddRestored(Report& report) const;
  void AddGradientCuts(Report& report) const;
  void AddNonFinite(Report& report) const;
  Violation MakeViolation(const Finding& f) const;
  void AddCulprits(const Finding& f, Violation& v) const;
  void AddFreedBy(const Finding& f, Violation& v) const;
  void AddUnpackHook(const SavedState& s, Violation& v) const;
  void AddUseSite(const SavedState& s, OpRef& victim) const;
  void AddCounterReset(const Finding& f, Violation& v) const;
  SavedTensorRef MakeTensorRef(const SavedState& s) const;
  std::optional<std::string> PytorchNames(const Finding& f, const NodeState& node,
                                          const SavedState& s) const;
  void AddFingerprintEvidence(const Finding& f, Violation& v) const;

  const AnalysisState& state_;
  // PyTorch's errors out of backward ops: the version check's, and the others.
  ExecMessages version_messages_;
  ExecMessages other_messages_;
  std::vector<bool> kept_;  // Per finding: reported (kFreed and kUnpackHook must be confirmed).
};

std::vector<Frame> ReportBuilder::StackFrames(InternId stack) const {
  std::vector<Frame> frames;
  if (stack == 0 || stack >= state_.stacks.size()) return frames;
  for (InternId id : state_.stacks[stack]) {
    Frame frame;
    if (id < state_.frames.size() && state_.frames[id].id != 0) {
      const format::FrameDef* shown = &state_.frames[id];
      if (shown->origin != 0 && shown->origin < state_.frames.size() &&
          state_.frames[shown->origin].id != 0) {
        // Generated code: the user's line it came from is what the user can act on.
        frame.generated_file = state_.Str(shown->file);
        frame.generated_line = shown->line;
        frame.generated_function = state_.Str(shown->function);
        shown = &state_.frames[shown->origin];
      }
      const format::FrameDef& f = *shown;
      frame.function = state_.Str(f.function);
      frame.file = state_.Str(f.file);
      frame.line = f.line;
      frame.library = state_.Str(f.library);
      frame.python = f.kind == format::FrameKind::kPython;
      frame.framework = f.framework;
    }
    frames.push_back(std::move(frame));
  }
  return frames;
}

OpRef ReportBuilder::MakeOpRef(ObjectId id) const {
  OpRef ref;
  ref.id = id;
  if (const OpInfo* op = state_.FindOp(id)) {
    ref.name = state_.Str(op->name);
    ref.overload = state_.Str(op->overload);
    ref.thread = op->thread;
    ref.stack = StackFrames(op->stack);
    ref.user_frame = FirstUserFrame(ref.stack);
    ref.module = state_.Str(op->module);
    ref.grad_mode = op->grad_mode;
  }
  return ref;
}

// Backward passes that torch.compile ran while it traced a region: AOTAutograd builds the joint
// forward-backward graph by running autograd over the region's ops under make_fx, so the pass's
// first node was made by an op called from make_fx's tracer. The engine's own, not a backward()
// or autograd.grad() of the program's.
uint64_t ReportBuilder::CountCompilePasses() const {
  constexpr std::string_view kMakeFx = "torch/fx/experimental/proxy_tensor.py";
  uint64_t count = 0;
  for (uint32_t root : state_.pass_roots) {
    if (root == IdIndex::kAbsent || state_.nodes[root].created_by == 0) continue;
    const OpRef op = UserOpRef(state_.nodes[root].created_by);
    count += std::any_of(op.stack.begin(), op.stack.end(),
                         [&](const Frame& f) { return f.file.ends_with(kMakeFx); });
  }
  return count;
}

// The op the user called, for an op seen in `innermost` (a write, or the op that created a node):
// its outermost enclosing ATen op, which carries the stack.
OpRef ReportBuilder::UserOpRef(ObjectId innermost) const {
  ObjectId outer = innermost;
  for (int depth = 0; depth < 256; ++depth) {
    const OpInfo* op = state_.FindOp(outer);
    if (op == nullptr || op->parent == 0) break;
    const OpInfo* parent = state_.FindOp(op->parent);
    // An op with a stack of its own inside a Python Function's apply() is one the Function's
    // forward called: its line is in the Function, not at the apply.
    if (parent == nullptr || parent->scope != OpScope::kFunction ||
        (op->stack != 0 && IsFunctionApply(*parent)) ||
        IsAutogradEngineName(state_.Str(parent->name)) || RunsTracedUserLine(*op)) {
      break;
    }
    outer = op->parent;
    if (IsCompiledRegion(*parent)) break;
  }
  OpRef ref = MakeOpRef(outer);
  SetFunctionContext(outer, ref);
  if (outer != innermost) {
    if (const OpInfo* inner = state_.FindOp(innermost)) {
      ref.detail = state_.Str(inner->name);
      if (ref.stack.empty()) {
        ref.stack = StackFrames(inner->stack);
        ref.user_frame = FirstUserFrame(ref.stack);
      }
    }
  }
  return ref;
}

// An op with a stack of its own directly inside a Python Function's apply() or its node's
// backward (the recorder gives those ops stacks): the Function, and the first user line outside
// it, past the framework frames that ran it (autograd/function.py, the engine's).
void ReportBuilder::SetFunctionContext(ObjectId id, OpRef& ref) const {
  const OpInfo* op = state_.FindOp(id);
  if (op == nullptr || op->parent == 0 || op->stack == 0 || !ref.user_frame) return;
  const OpInfo* parent = state_.FindOp(op->parent);
  if (parent == nullptr) return;
  // In backward, with grad mode off: a Python backward's own ops (the recorder gives a C++
  // formula's none); with it on, a checkpoint's recomputation of the program's forward.
  const bool backward = parent->scope == OpScope::kBackwardFunction;
  if (backward && op->grad_mode) return;
  if (!backward && !IsFunctionApply(*parent)) return;
  std::string name = state_.Str(parent->name);
  constexpr std::string_view kBackward = "Backward";
  if (backward && name.ends_with(kBackward)) name.resize(name.size() - kBackward.size());
  // The Function's method ("XEntropy.forward"; "forward" where Python names no class), then the
  // first user frame outside it; without that frame, past the framework's frames that ran it.
  const std::string method = backward ? "backward" : "forward";
  auto it = std::find_if(ref.stack.begin(), ref.stack.end(), [&](const Frame& f) {
    return f.function == name + "." + method || f.function == method;
  });
  if (it == ref.stack.end()) {
    it = std::find_if(ref.stack.begin(), ref.stack.end(), [](const Frame& f) { return f.framework; });
  } else {
    ++it;
  }
  it = std::find_if(it, ref.stack.end(), [](const Frame& f) { return IsUserFrame(f); });
  ref.function = std::move(name);
  ref.in_function_backward = backward;
  if (it != ref.stack.end()) ref.called_from = UserFrame{it->file, it->line, it->function};
}

// The backward op an error came out of: the op itself or its nearest backward ancestor.
ObjectId ReportBuilder::BackwardOpOf(ObjectId op) const {
  for (int depth = 0; op != 0 && depth < 256; ++depth) {
    const OpInfo* info = state_.FindOp(op);
    if (info == nullptr) return 0;
    if (info->scope == OpScope::kBackwardFunction) return op;
    op = info->parent;
  }
  return 0;
}

ExecMessages ReportBuilder::MessagesByBackwardOp(
    const std::vector<std::pair<ObjectId, std::string>>& errors) const {
  ExecMessages messages;
  for (const auto& [op, message] : errors) {
    ObjectId backward = BackwardOpOf(op);
    if (backward != 0) messages[backward] = message;
  }
  return messages;
}

// What PyTorch said about an execution, preferring a message of `kind`: the error that came out
// of its backward op, else, when it threw, the program's last error; nullptr when none was
// recorded.
const std::string* ReportBuilder::MessageOf(ObjectId exec_op, bool exec_threw,
                                            ViolationKind kind) const {
  auto own_version = version_messages_.find(exec_op);
  auto own_other = other_messages_.find(exec_op);
  if (own_version != version_messages_.end() && MessageIsOf(kind, own_version->second)) {
    return &own_version->second;
  }
  if (own_other != other_messages_.end() && MessageIsOf(kind, own_other->second)) {
    return &own_other->second;
  }
  if (own_version != version_messages_.end()) return &own_version->second;
  if (own_other != other_messages_.end()) return &own_other->second;
  if (!exec_threw) return nullptr;
  const std::string& preferred =
      kind == ViolationKind::kVersion ? state_.final_error : state_.other_final_error;
  const std::string& other =
      kind == ViolationKind::kVersion ? state_.other_final_error : state_.final_error;
  if (!preferred.empty()) return &preferred;
  return other.empty() ? nullptr : &other;
}

// True when a finding of `kind` for this execution is kept.
bool ReportBuilder::ExecHas(ObjectId exec_op, ViolationKind kind) const {
  for (size_t i = 0; i < state_.findings.size(); ++i) {
    const Finding& f = state_.findings[i];
    if (kept_[i] && f.exec_op == exec_op && f.kind == kind && !f.simulated) return true;
  }
  return false;
}

// Every finding is reported but kFreed, kUnpackHook and kCachedMutated, which the analysis
// offers for executions that threw: each is kept when PyTorch's message is its error, or, without
// a message, when nothing else explains the throw (freed: only when the node did run in an
// earlier pass).
void ReportBuilder::SelectKept() {
  const std::vector<Finding>& findings = state_.findings;
  kept_.assign(findings.size(), true);
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    if (f.kind == ViolationKind::kFreed) kept_[i] = false;
    if (f.kind == ViolationKind::kUnpackHook) kept_[i] = false;
    if (f.kind == ViolationKind::kCachedMutated) kept_[i] = false;
  }
  for (ViolationKind kind : {ViolationKind::kFreed, ViolationKind::kUnpackHook,
                             ViolationKind::kCachedMutated}) {
    for (size_t i = 0; i < findings.size(); ++i) {
      const Finding& f = findings[i];
      if (f.kind != kind) continue;
      if (const std::string* message = MessageOf(f.exec_op, f.exec_threw, kind)) {
        kept_[i] = MessageIsOf(kind, *message);
        continue;
      }
      bool explained = ExecHas(f.exec_op, ViolationKind::kVersion) ||
                       ExecHas(f.exec_op, ViolationKind::kDetached) ||
                       ExecHas(f.exec_op, ViolationKind::kFreed);
      kept_[i] = !explained && (kind != ViolationKind::kFreed || f.earlier_exec_op != 0);
    }
  }
}

// True when `f` is a version violation PyTorch ran into whose versions `message` names.
bool ReportBuilder::IsNamedBy(const Finding& f, const std::string& message) const {
  return f.kind == ViolationKind::kVersion && !f.simulated &&
         MessageMatches(message, f.current_version, state_.saved[f.saved].saved.saved_version);
}

// The finding PyTorch stopped at: the first finding of the first execution that threw whose kind
// is that of PyTorch's message (when the message names versions, the one it names); without a
// recorded throw, the first version violation the final message matches.
std::optional<size_t> ReportBuilder::FindStopped() const {
  const std::vector<Finding>& findings = state_.findings;
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    if (!kept_[i] || f.kind == ViolationKind::kSilent || f.simulated) continue;
    bool own = version_messages_.contains(f.exec_op) || other_messages_.contains(f.exec_op);
    if (!f.exec_threw && !own) continue;
    const std::string* message = MessageOf(f.exec_op, f.exec_threw, f.kind);
    if (message == nullptr) return i;
    if (!MessageIsOf(f.kind, *message)) continue;
    if (f.kind != ViolationKind::kVersion) return i;
    for (size_t j = i; j < findings.size() && findings[j].exec_op == f.exec_op; ++j) {
      if (kept_[j] && IsNamedBy(findings[j], *message)) return j;
    }
    return i;
  }
  if (state_.final_error.empty()) return std::nullopt;
  for (size_t i = 0; i < findings.size(); ++i) {
    if (IsNamedBy(findings[i], state_.final_error)) return i;
  }
  return std::nullopt;
}

// Every kept finding as a Violation, the one PyTorch stopped at first, with what PyTorch said.
void ReportBuilder::AddViolations(Report& report) const {
  const std::vector<Finding>& findings = state_.findings;
  std::optional<size_t> stopped = FindStopped();
  std::vector<size_t> order;
  if (stopped) order.push_back(*stopped);
  for (size_t i = 0; i < findings.size(); ++i) {
    if (kept_[i] && (!stopped || i != *stopped)) order.push_back(i);
  }
  for (size_t i : order) {
    Violation v = MakeViolation(findings[i]);
    AddPytorchOutcome(findings[i], stopped && i == *stopped, v);
    report.violations.push_back(std::move(v));
  }
}

// Whether PyTorch raised for this violation, and its message. A version violation raised when
// its execution threw or a version error came out of it, unless PyTorch's message for that
// execution is another kind's (then it raises once that one is fixed); the other kinds raised
// when their execution threw with their kind's message, or with none recorded.
void ReportBuilder::AddPytorchOutcome(const Finding& f, bool stopped, Violation& v) const {
  if (f.kind == ViolationKind::kSilent || f.simulated) return;
  const std::string* message = MessageOf(f.exec_op, f.exec_threw || stopped, f.kind);
  bool of_kind = message != nullptr && MessageIsOf(f.kind, *message);
  if (f.kind == ViolationKind::kVersion) {
    bool own = version_messages_.contains(f.exec_op);
    v.pytorch_raised = (f.exec_threw || own || stopped) && (message == nullptr || of_kind);
  } else {
    v.pytorch_raised = f.exec_threw && (message == nullptr || of_kind);
  }
  if (v.pytorch_raised && of_kind) v.pytorch_message = *message;
}

// Each backward function that threw while no finding belongs to its execution, in op order, with
// what PyTorch said: its own error when one came out of it, else the program's last error.
void ReportBuilder::AddUnexplainedErrors(Report& report) const {
  std::vector<ObjectId> threw(state_.threw_execs.begin(), state_.threw_execs.end());
  std::sort(threw.begin(), threw.end());
  for (ObjectId op : threw) {
    bool explained = false;
    for (size_t i = 0; i < state_.findings.size() && !explained; ++i) {
      explained = kept_[i] && state_.findings[i].exec_op == op;
    }
    if (explained) continue;
    UnexplainedError error;
    error.backward_op = MakeOpRef(op);
    if (auto it = version_messages_.find(op); it != version_messages_.end()) {
      error.message = it->second;
    } else if (auto other = other_messages_.find(op); other != other_messages_.end()) {
      error.message = other->second;
    }
    if (error.message.empty()) {
      error.message = !state_.other_final_error.empty() ? state_.other_final_error
                                                         : state_.final_error;
    }
    report.unexplained_errors.push_back(std::move(error));
  }
}

void ReportBuilder::AddProgramError(Report& report) const {
  if (!state_.program_error || !report.violations.empty() || !report.unexplained_errors.empty()) {
    return;
  }
  // PyTorch's "does not require grad": the gradient cut that explains it is the verdict.
  for (const GradientCut& cut : report.gradient_cuts) {
    if (cut.raised && cut.pytorch_message == state_.program_error->message) return;
  }
  const AnalysisState::ProgramErrorSeen& seen = *state_.program_error;
  // An interrupted run says so in the trace (its last steps may be missing), not as an error.
  if (seen.type == "KeyboardInterrupt") return;
  ProgramError error;
  error.type = seen.type;
  error.message = seen.message;
  if (seen.op != 0) error.op = UserOpRef(seen.op);
  report.program_error = std::move(error);
}

void ReportBuilder::AddWarnings(Report& report) const {
  std::vector<std::string>& warnings = report.warnings;
  if (!state_.final_error.empty() && state_.op_count == 0) {
    std::string message = state_.final_error;
    if (size_t cut = message.find(" Hint:"); cut != std::string::npos) message.resize(cut);
    warnings.push_back("the program ended with an error in a step this trace does not hold: " +
                       message);
  } else if (!state_.final_error.empty() &&
             std::find(kept_.begin(), kept_.end(), true) == kept_.end()) {
    warnings.push_back(
        "PyTorch raised a version-counter error that the trace does not explain (was the "
        "recorder on for the whole step?)");
  }
  for (ObjectId op : state_.threw_execs) {
    if (!version_messages_.contains(op)) continue;
    if (!ExecHas(op, ViolationKind::kVersion)) {
      warnings.push_back("backward op " + std::to_string(op) +
                         " raised a version-counter error that the trace does not explain");
    }
  }
  if (state_.data_loss_records != 0) {
    warnings.push_back("the recorder lost " + std::to_string(state_.data_lost) + " records (" +
                       std::to_string(state_.data_loss_records) +
                       " data-loss records): culprits may be missing");
  }
  for (const auto& [name, count] : state_.unknown_saved_nodes) {
    const std::string& type = state_.Str(name);
    warnings.push_back(std::to_string(count) + " node(s) " +
                       (type.empty() ? std::string("of an unknown type") : "of type " + type) +
                       ": saved tensors not visible to the recorder, not checked");
  }
  if (state_.unknown_node_execs != 0) {
    warnings.push_back(std::to_string(state_.unknown_node_execs) +
                       " node execution(s) of nodes with no NodeRecord, not checked");
  }
}

Violation ReportBuilder::MakeViolation(const Finding& f) const {
  const NodeState& node = state_.nodes[f.node];
  const SavedState& s = state_.saved[f.saved];
  Violation v;
  v.kind = f.kind;
  AddCulprits(f, v);
  // detach_ runs a range of its own inside: the op the user called is all there is to say.
  if (f.kind == ViolationKind::kDetached && v.culprit) v.culprit->detail.clear();
  const ObjectId victim = f.victim_op != 0 ? f.victim_op : node.created_by;
  if (victim != 0) v.victim = UserOpRef(victim);
  if (v.victim && s.saved.used_at != 0) AddUseSite(s, *v.victim);
  v.backward_node = {node.id, state_.Str(node.name), node.sequence_nr, node.forward_thread};
  v.saved_version = f.has_baseline ? f.baseline : s.saved.saved_version;
  v.current_version = f.current_version;
  v.tensor = MakeTensorRef(s);
  // Only the version check's message names the tensor.
  if (f.kind == ViolationKind::kVersion) v.pytorch_names = PytorchNames(f, node, s);
  if (f.kind == ViolationKind::kSilent) {
    v.evidence = f.by_fingerprint ? SilentEvidence::kFingerprint
                 : f.storage_swap ? SilentEvidence::kStorageSwap
                 : f.unpacked     ? SilentEvidence::kUnpackHook
                 : f.unchecked    ? SilentEvidence::kUncheckedSave
                 : f.reset        ? SilentEvidence::kCounterReset
                                  : SilentEvidence::kAliasedWrite;
  }
  v.recomputed = f.recomputed;
  v.read_by_recompute = s.read_by_recompute;
  if (f.recomputing != IdIndex::kAbsent) {
    const NodeState& r = state_.nodes[f.recomputing];
    v.recomputing = NodeRef{r.id, state_.Str(r.name), r.sequence_nr, r.forward_thread};
  }
  if (f.has_hashes) v.fingerprint = Fingerprints{f.hash_at_save, f.hash_at_use};
  if (f.by_fingerprint) AddFingerprintEvidence(f, v);
  if (f.reset) AddCounterReset(f, v);
  if (f.changed_source != 0) v.changed_source = UserOpRef(f.changed_source);
  if (f.kind == ViolationKind::kFreed) AddFreedBy(f, v);
  if (f.kind == ViolationKind::kUnpackHook || f.unpacked) AddUnpackHook(s, v);
  if (f.unpacked) {
    v.unpacked = UnpackedRef{DTypeName(f.unpacked->dtype), f.unpacked->shape,
                             DTypeName(f.unpacked->saved_dtype), f.unpacked->saved_shape};
  }
  v.simulated = f.simulated;
  v.backward_pass = f.pass;
  if (uint64_t step = state_.StepOfPass(f.pass); step != AnalysisState::kNoStep) v.step = step;
  v.node_exec_op = f.exec_op;
  return v;
}

// The first writer is the culprit (none when its write was not recorded); the others are later
// culprits, an empty OpRef standing for each unrecorded one.
void ReportBuilder::AddCulprits(const Finding& f, Violation& v) const {
  for (size_t i = 0; i < f.writers.size(); ++i) {
    ObjectId writer = f.writers[i];
    if (i == 0) {
      if (writer != 0) v.culprit = UserOpRef(writer);
    } else {
      v.later_culprits.push_back(writer != 0 ? UserOpRef(writer) : OpRef{});
    }
  }
}

// The earlier execution that freed the node's saved tensors: its backward op, with the stack of
// the backward() or autograd.grad() call that ran its pass when the op that entered that pass ran
// inside one (the ones_like of an implicit gradient does; an explicit gradient's op need not).
void ReportBuilder::AddFreedBy(const Finding& f, Violation& v) const {
  if (f.earlier_exec_op == 0) return;
  v.freed_by_pass = f.earlier_pass;
  OpRef culprit = MakeOpRef(f.earlier_exec_op);
  if (f.earlier_pass < state_.pass_entry_ops.size()) {
    ObjectId entry = state_.pass_entry_ops[f.earlier_pass];
    const OpInfo* op = state_.FindOp(entry);
    std::vector<Frame> stack = op != nullptr ? StackFrames(op->stack) : std::vector<Frame>{};
    if (std::any_of(stack.begin(), stack.end(), IsBackwardCallFrame)) {
      culprit.user_frame = FirstUserFrame(stack);
      culprit.stack = std::move(stack);
    }
  }
  v.culprit = std::move(culprit);
}

// The unpack hook that handed backward the tensor it failed on: no op wrote anything, the hook's
// code decided what backward got, so its definition is the line to fix. Its own frame even when
// it is framework code (save_on_cpu's): the trace knows no other line for it.
void ReportBuilder::AddUnpackHook(const SavedState& s, Violation& v) const {
  std::vector<Frame> stack = StackFrames(s.saved.unpack_hook);
  if (stack.empty() || stack.front().file.empty()) return;
  OpRef hook;
  hook.hook = true;
  hook.user_frame = UserFrame{stack.front().file, stack.front().line, stack.front().function};
  hook.stack = std::move(stack);
  v.culprit = std::move(hook);
}

// A tensor a torch.compile region saved: the region is the op that saved it, and the user's line
// that backward uses it for (SavedTensor.used_at: inside the region, as torch traced it) is the
// line that saved it in eager mode. Its frames go before the region's call, and name the victim.
void ReportBuilder::AddUseSite(const SavedState& s, OpRef& victim) const {
  std::vector<Frame> inside = StackFrames(s.saved.used_at);
  std::optional<UserFrame> user = FirstUserFrame(inside);
  if (!user) return;
  victim.stack.insert(victim.stack.begin(), inside.begin(), inside.end());
  victim.user_frame = std::move(user);
}

// The counter went back: the op that last showed the higher version and the one that then
// showed the lower.
void ReportBuilder::AddCounterReset(const Finding& f, Violation& v) const {
  CounterReset reset;
  reset.from = f.reset->before;
  reset.to = f.reset->after;
  reset.before = UserOpRef(f.reset_previous_op);
  reset.after = UserOpRef(f.reset->op);
  v.counter_reset = std::move(reset);
}

void ReportBuilder::AddRestored(Report& report) const {
  report.restored_count = state_.restored_count;
  for (const RestoredUse& use : state_.restored) {
    const NodeState& node = state_.nodes[use.node];
    RestoredWrite& w = report.restored.emplace_back();
    w.backward_node = {node.id, state_.Str(node.name), node.sequence_nr, node.forward_thread};
    w.tensor = MakeTensorRef(state_.saved[use.saved]);
    w.writer = UserOpRef(use.writer);
    w.backward_pass = use.pass;
  }
}

SavedTensorRef ReportBuilder::MakeTensorRef(const SavedState& s) const {
  SavedTensorRef tensor;
  tensor.id = s.saved.tensor;
  tensor.saved_name = state_.Str(s.saved.name);
  tensor.list_index = s.saved.list_index;
  if (s.meta_known) {
    tensor.shape = state_.layouts.Shape(s.layout);
    tensor.dtype = DTypeName(s.dtype);
    tensor.device = DeviceName(s.device);
  }
  tensor.storage = s.saved.storage;
  tensor.version_counter = s.saved.version_counter;
  tensor.is_output = s.saved.is_output;
  tensor.is_leaf = s.saved.is_leaf;
  tensor.output_nr = s.saved.output_nr;
  if (s.bytes_storage != s.saved.storage) {
    if (const TensorState* t = state_.FindTensor(s.saved.tensor)) tensor.inner = t->inner;
  }
  return tensor;
}

// What PyTorch's message calls the saved tensor ("output 0 of SigmoidBackward0"): the node's own
// output, the grad_fn a modified view is regenerated with, or the tensor's grad_fn when the node
// ran; nullopt for a leaf or when the trace does not say.
std::optional<std::string> ReportBuilder::PytorchNames(const Finding& f, const NodeState& node,
                                                       const SavedState& s) const {
  auto output_of = [this](uint32_t output_nr, std::string_view node_name) {
    return "output " + std::to_string(output_nr) + " of " +
           PytorchNodeName(node_name, state_.recording_torch);
  };
  if (s.saved.is_output) return output_of(s.saved.output_nr, state_.Str(node.name));
  if (f.view_regenerated) return output_of(0, "AsStridedBackward0");
  if (f.use_known && f.use_grad_fn != 0) {
    uint32_t grad_fn = state_.index.Find(f.use_grad_fn, IdKind::kNode);
    if (grad_fn != IdIndex::kAbsent) {
      return output_of(f.use_output_nr, state_.Str(state_.nodes[grad_fn].name));
    }
  }
  return std::nullopt;
}

// A silent write found by fingerprint: the ops that touched the saved bytes between the save and
// the use (the first that wrote is the culprit) and the CUDA work launched outside any op then.
void ReportBuilder::AddFingerprintEvidence(const Finding& f, Violation& v) const {
  for (const auto& [op, wrote] : f.touches) {
    OpRef ref = UserOpRef(op);
    auto it = std::find_if(v.candidates.begin(), v.candidates.end(),
                           [&ref](const SilentCandidate& c) { return SameCandidate(c.op, ref); });
    if (it != v.candidates.end()) {
      it->wrote |= wrote;
      continue;
    }
    v.candidates.push_back({std::move(ref), wrote});
  }
  // A candidate that wrote did write the saved bytes (through another tensor over them).
  for (const SilentCandidate& c : v.candidates) {
    if (!c.wrote) continue;
    if (!v.culprit) {
      v.culprit = c.op;
    } else {
      v.later_culprits.push_back(c.op);
    }
  }
  for (const LooseKernel& k : state_.loose_kernels) {
    if (k.start_ns < f.save_ns || k.start_ns > f.use_ns) continue;
    KernelRef kernel;
    kernel.name = k.name != 0 ? state_.Str(k.name) : CopyKindName(k.copy);
    kernel.device = k.device;
    kernel.start_ns = k.start_ns;
    kernel.end_ns = k.end_ns;
    v.kernels.push_back(std::move(kernel));
  }
}


void ReportBuilder::AddGradientCuts(Report& report) const {
  for (const CutFinding& f : state_.cut_findings) {
    GradientCut cut;
    cut.cause = f.cause;
    if (f.op != 0 && f.checkpoint != 0) {
      // The op the checkpointed function called: the outermost one inside the checkpoint.
      ObjectId inside = f.op;
      for (int depth = 0; depth < 256; ++depth) {
        const OpInfo* op = state_.FindOp(inside);
        if (op == nullptr || op->parent == 0 || op->parent == f.checkpoint) break;
        inside = op->parent;
      }
      cut.op = MakeOpRef(inside);
    } else if (f.op != 0) {
      cut.op = UserOpRef(f.op);
    }
    if (f.checkpoint != 0) cut.checkpoint = UserOpRef(f.checkpoint);
    cut.raised = f.raised;
    if (f.loss_op != 0) cut.loss = UserOpRef(f.loss_op);
    cut.pytorch_message = f.message;
    cut.parameter_count = f.parameter_count;
    cut.backward_passes = f.backward_passes;
    for (const CutFinding::Parameter& p : f.parameters) {
      CutParameter parameter;
      parameter.id = p.tensor;
      parameter.name = p.name;
      parameter.module = state_.Str(p.module);
      if (const TensorState* t = state_.FindTensor(p.tensor)) {
        parameter.shape = state_.layouts.Shape(t->layout);
      }
      cut.parameters.push_back(std::move(parameter));
    }
    cut.summary = CutParameterSummary(cut.parameters, cut.parameter_count);
    cut.help = CutHelp(cut.cause);
    report.gradient_cuts.push_back(std::move(cut));
  }
}

void ReportBuilder::AddNonFinite(Report& report) const {
  report.ranges_recorded = state_.ranges_recorded;
  report.scaler_skipped_steps = state_.scaler_skipped_steps;
  if (!state_.non_finite) return;
  const NonFiniteFinding& f = *state_.non_finite;
  NonFinite n;
  n.cause = f.cause;
  n.nan = f.nan;
  n.backward = f.backward;
  if (f.op != 0) n.op = f.backward ? MakeOpRef(f.op) : UserOpRef(f.op);
  if (f.backward && f.node != 0) {
    uint32_t slot = state_.index.Find(f.node, IdKind::kNode);
    if (slot != IdIndex::kAbsent && state_.nodes[slot].created_by != 0) {
      n.forward = UserOpRef(state_.nodes[slot].created_by);
    }
  }
  if (f.became_nan != 0) n.became_nan = UserOpRef(f.became_nan);
  n.dtype = f.dtype >= 0 ? DTypeName(f.dtype) : "";
  n.dtype_max = DTypeMax(f.dtype);
  n.input_max_abs = f.input_max_abs;
  n.step = f.step;
  n.reached = f.reached;
  n.later_ops = f.later_ops;
  n.steps = f.steps;
  n.help = NonFiniteHelp(f.cause);
  report.non_finite = std::move(n);
}

}  // namespace

Report BuildReport(const AnalysisState& state) { return ReportBuilder(state).Build(); }

namespace {

// The first torch release whose messages name the forward op (Node::forward_op_name()).
constexpr int kForwardOpNamesMajor = 2;
constexpr int kForwardOpNamesMinor = 13;

// "2.15.0+cu130" -> {2, 15}; nullopt when it does not start with two numbers.
std::optional<std::pair<int, int>> MajorMinor(std::string_view version) {
  int major = 0;
  int minor = 0;
  const char* end = version.data() + version.size();
  auto [dot, major_error] = std::from_chars(version.data(), end, major);
  if (major_error != std::errc() || dot == end || *dot != '.') return std::nullopt;
  auto [rest, minor_error] = std::from_chars(dot + 1, end, minor);
  if (minor_error != std::errc()) return std::nullopt;
  return std::pair{major, minor};
}

}  // namespace

std::string PytorchNodeName(std::string_view node_name, std::string_view torch_version) {
  std::optional<std::pair<int, int>> version = MajorMinor(torch_version);
  if (!version || *version < std::pair{kForwardOpNamesMajor, kForwardOpNamesMinor}) {
    return std::string(node_name);
  }
  // As torch's Node::forward_op_name(): without the last "Backward" when only digits follow it,
  // and without those digits when they are the first overload's "0" (AddBackward1 is Add1).
  size_t at = node_name.rfind("Backward");
  if (at == std::string_view::npos) return std::string(node_name);
  std::string_view rest = node_name.substr(at + std::strlen("Backward"));
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::string(node_name);
  }
  return std::string(node_name.substr(0, at)) + std::string(rest == "0" ? "" : rest);
}

}  // namespace torchrr::replayer

