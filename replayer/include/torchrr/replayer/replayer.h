// The replayer's analysis: which op, on which line, modified which saved tensor.
//
// PyTorch says "one of the variables needed for gradient computation has been modified by an
// inplace operation" and names the node that needed the tensor, not the op that modified it. A
// torchrr trace holds every op with the version counters it read and bumped, every autograd node
// with the tensors it saved (and their versions at save time), and every node's execution in
// backward. The Analyzer rebuilds the timeline of every version counter from those records and
// re-runs autograd's version check (SavedVariable::unpack) for every node execution, at the point
// in the trace where the node started; a saved tensor whose counter moved since the save is a
// violation, and the ops that moved it are the culprits. It also finds writes into a saved
// tensor's bytes through a tensor that shares the storage but not the counter (`.data`) or whose
// counter was set back afterwards, which PyTorch never reports; saved tensors detached in place,
// used again after a backward pass freed them, or handed back by an unpack hook that backward
// then failed on; and, when a backward pass threw part way, the violations the rest of that pass
// would have hit.
//
// Torch-free: it reads records (torchrr/format/records.h) and nothing else. The meaning of every
// field it relies on is in records.h; what it reports, field by field, is in replayer/SCHEMA.md.
#ifndef TORCHRR_REPLAYER_REPLAYER_H_
#define TORCHRR_REPLAYER_REPLAYER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "torchrr/format/records.h"

namespace torchrr::replayer {

// One frame of a recorded stack, symbolized; strings are empty and line 0 when unknown.
struct Frame {
  std::string function;
  std::string file;
  uint32_t line = 0;
  std::string library;
  bool python = false;
  bool framework = false;
  // A frame in code torch generated from the user's (torch.fx's "<eval_with_key>.N", which
  // torch.compile runs) whose line's origin the trace names (FrameDef.origin): the fields above
  // are the origin's, these the generated line's. Empty otherwise.
  std::string generated_file;
  uint32_t generated_line = 0;
  std::string generated_function;
};

// A frame of the user's code: not framework code (torch, site-packages, the runtime, torchrr),
// and named (a native frame nothing could symbolize is nobody's line).
inline bool IsUserFrame(const Frame& f) {
  return !f.framework && (!f.file.empty() || !f.function.empty());
}

// Where in the user's code an op was called: the first frame, innermost first, that is not
// framework code (torch, the runtime, torchrr).
struct UserFrame {
  std::string file;
  uint32_t line = 0;
  std::string function;
};

// An op as a report names it.
struct OpRef {
  format::ObjectId id = 0;       // OpRecord id; 0 when the op was not recorded.
  std::string name;              // "aten::mul_"; for a culprit, the outermost ATen op the user called.
  std::string overload;          // "Tensor"; empty for the default overload.
  std::string detail;            // Culprits: the innermost op that did the write, when it differs
                                 // from `name` ("aten::add_" inside "aten::foo").
  uint32_t thread = 0;
  std::vector<Frame> stack;      // Innermost first; empty when stacks were off.
  std::optional<UserFrame> user_frame;
  // The nn.Module the op ran under, "layers.1.mlp.act_fn (SiLU)" (format 1.8, OpRecord.module_path);
  // empty when none or not recorded.
  std::string module;
  // Not an op: a saved_tensors_hooks unpack hook, `stack` and `user_frame` its definition (id 0,
  // no name).
  bool hook = false;
  bool grad_mode = true;         // GradMode at the op's start (OpRecord.grad_mode).
  // An op a Python autograd.Function's own code ran (its forward or backward): the Function
  // ("XEntropy"), whether in backward, and the program's line outside the Function that ran it
  // (the apply() call; in backward, the backward() call). Empty and nullopt otherwise.
  std::string function;
  bool in_function_backward = false;
  std::optional<UserFrame> called_from;
};

enum class ViolationKind : uint8_t {
  kVersion = 0,     // The saved tensor's version counter moved: PyTorch raises (or would have).
  kSilent = 1,      // Its bytes changed and its counter does not show it: PyTorch is silent.
  kDetached = 2,    // detach_() cut a saved input from its graph: PyTorch raises at unpack.
  kFreed = 3,       // An earlier backward pass ran the node and freed what it saved: PyTorch
                    // raises "backward through the graph a second time".
  kUnpackHook = 4,  // The node threw on a saved tensor that a saved_tensors_hooks unpack hook
                    // returned: PyTorch checks nothing of what the hook returns.
  kCachedMutated = 5,  // Selective activation checkpointing cached an op's output in forward
                       // and it was modified before backward's recomputation: PyTorch raises.
};
// "version", "silent", "detached", "freed", "unpack_hook", "cached_mutated"
const char* ViolationKindName(ViolationKind kind);

// How a silent write was found.
enum class SilentEvidence : uint8_t {
  kNone = 0,          // Not a silent violation.
  kAliasedWrite = 1,  // A recorded op wrote its bytes through a tensor with another counter.
  kFingerprint = 2,   // --verify-saved: its bytes' fingerprint changed between save and use, and
                      // no recorded write explains it (numpy, a raw kernel, an extension).
  kCounterReset = 3,  // A recorded op wrote it and its version counter was later set back
                      // (torch.autograd._unsafe_preserve_version_counter), so the check passes.
  kUncheckedSave = 4, // Its counter moved, but backward used it without PyTorch's version check
                      // (a saved-tensor hook packed the tensor itself; checkpointing recomputed
                      // it; AOTAutograd saved it).
  kUnpackHook = 5,    // A saved_tensors_hooks unpack hook handed backward a tensor of another
                      // dtype or shape than was saved (Violation::unpacked), and backward
                      // computed the gradient from it without an error.
  kStorageSwap = 6,   // The saved tensor was moved to another storage (`.data =`, set_data,
                      // Module._apply) between save and use: backward read the new values, and
                      // no version counter moved. The culprit is the assignment.
};
// "", "aliased_write", "fingerprint", "counter_reset", "unchecked_save", "unpack_hook",
// "storage_swap"
const char* SilentEvidenceName(SilentEvidence evidence);

// For evidence kCounterReset: the counter went backwards between two recorded ops, the second
// started after the first ended. Nothing records the reset itself (it is not an op).
struct CounterReset {
  uint32_t from = 0;     // The version `before` showed at its end.
  uint32_t to = 0;       // The lower version `after` showed at its start.
  OpRef before;          // The last recorded op to show `from`.
  OpRef after;           // The first recorded op to show `to`.
};

// The saved tensor's bytes' fingerprints (kernels/fingerprint.h), when --verify-saved was on and
// they differ.
struct Fingerprints {
  uint64_t at_save = 0;
  uint64_t at_use = 0;
};

// For a silent write found by fingerprint: an op that, between the save and the use, wrote into
// the saved bytes or made a tensor over them (a view, detach()) through which they could be
// written outside PyTorch's ops.
struct SilentCandidate {
  OpRef op;             // The outermost op the user called.
  bool wrote = false;   // It bumped a version on those bytes; otherwise it made an alias.
};

// A CUDA kernel, copy or memset launched outside any recorded op.
struct KernelRef {
  std::string name;     // The kernel's name; "[memcpy HtoD]", "[memset]" for copies.
  int device = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// What an unpack hook handed backward for a saved tensor, unlike what was saved.
struct UnpackedRef {
  std::string dtype;                    // "float16"; what the hook returned.
  std::vector<int64_t> shape;
  std::string saved_dtype;              // What the node saved.
  std::vector<int64_t> saved_shape;
};

// The saved tensor, as it was when the node saved it.
struct SavedTensorRef {
  format::ObjectId id = 0;              // Tensor id; 0 when the recorder did not know it.
  std::string saved_name;               // The SavedVariable member: "self", "result", "other".
  uint32_t list_index = format::TensorUse::kNotInList;
  std::vector<int64_t> shape;           // Empty when the tensor's metadata was not recorded.
  std::string dtype;                    // "float32"; empty when unknown.
  std::string device;                   // "cpu", "cuda:0"; empty when unknown.
  format::ObjectId storage = 0;
  format::ObjectId version_counter = 0;
  bool is_output = false;
  bool is_leaf = false;
  uint32_t output_nr = 0;
  // A wrapper subclass (a DTensor): the tensor it wraps, whose storage holds its bytes (its
  // shard); 0 for any other tensor.
  format::ObjectId inner = 0;
};

struct NodeRef {
  format::ObjectId id = 0;
  std::string name;                     // "SigmoidBackward0"
  int64_t sequence_nr = -1;
  uint64_t forward_thread = 0;
};

struct Violation {
  ViolationKind kind = ViolationKind::kVersion;
  // By kind: kVersion, kSilent: the first op that wrote the tensor after the save, absent when
  // the write was not recorded (the counter jumped between two recorded uses). kDetached: the
  // detach_() op. kFreed: the node's execution in the earlier pass that freed it (id and name of
  // its backward op), with the stack of the backward() or autograd.grad() call that ran that
  // pass when the trace shows it (else no stack). kUnpackHook: the unpack hook (`hook` set), where
  // it was defined; absent when the trace does not say (a C++ hook, traces before format 1.3).
  std::optional<OpRef> culprit;
  std::vector<OpRef> later_culprits;    // Later writes before the use, in trace order.
  std::optional<OpRef> victim;          // The forward op that created the node (saved the tensor).
  NodeRef backward_node;                // The node that needed the tensor.
  // Activation checkpointing: backward needed the tensor (an input of the checkpointed call) to
  // recompute what this node saved.
  std::optional<NodeRef> recomputing;
  // Activation checkpointing: the tensor is the one backward recomputed for the node (what the
  // node saved in forward was a placeholder), written after the recomputation saved it.
  bool recomputed = false;
  // Reentrant activation checkpointing: the tensor was not saved, but read by the checkpointed
  // block in forward (a weight, a buffer), and its recomputation in backward read it again after
  // the write. `victim` is the checkpoint's call.
  bool read_by_recompute = false;
  uint32_t saved_version = 0;
  uint32_t current_version = 0;         // The counter's version when the node ran (or would have).
  SavedTensorRef tensor;
  bool pytorch_raised = false;          // PyTorch raised for this node's version check.
  std::optional<std::string> pytorch_message;  // PyTorch's message, when recorded.
  // What PyTorch's message names: "output 0 of SigmoidBackward0"; nullopt for a leaf or unknown.
  std::optional<std::string> pytorch_names;
  // Found by simulating the part of a backward pass that did not run because a node threw.
  bool simulated = false;
  uint64_t backward_pass = 0;           // Index of the backward pass, from 0.
  // The training step of that pass: the StepRecord's number when the trace marks steps
  // (--keep-last, torchrr.step()), else counted by the recorder's own step rule from 0 (each
  // micro-batch a step); nullopt before a trace's first StepRecord.
  std::optional<uint64_t> step;
  format::ObjectId node_exec_op = 0;    // The execution's OpRecord; 0 when simulated.
  SilentEvidence evidence = SilentEvidence::kNone;  // For kSilent: how it was found.
  // The recording is incomplete (Report::incomplete()): a write or a use in the part that was
  // not recorded could change this verdict.
  bool recording_incomplete = false;
  std::optional<Fingerprints> fingerprint;          // When recorded and changed.
  // kFingerprint: the candidates, in trace order, and the kernels launched outside any op
  // between the save and the use.
  std::vector<SilentCandidate> candidates;
  std::vector<KernelRef> kernels;
  std::optional<CounterReset> counter_reset;  // kCounterReset: the evidence.
  // The culprit wrote back bytes made the way the saved ones were (FSDP2's all-gather before
  // backward), but a parameter was written after the save: the write to the parameter its values
  // come from (an optimizer step between forward and backward). The trace follows a DTensor
  // parameter's writes on the DTensor, not on the shard the refill copies from.
  std::optional<OpRef> changed_source;
  std::optional<uint64_t> freed_by_pass;      // kFreed: the earlier pass, when recorded.
  // kUnpackHook, and kSilent with evidence kUnpackHook: what the hook returned, when the recorder
  // saw it differ from the saved tensor.
  std::optional<UnpackedRef> unpacked;
};

// Violations that are one diagnostic: the same kind, culprit line and victim line (a bug in a
// layer that runs at every step, in every layer). The report prints the first and says where
// the others were.
struct ViolationGroup {
  std::vector<size_t> violations;       // Indices into Report::violations, in report order.
  std::vector<uint64_t> steps;          // The distinct steps they were in, ascending.
  // The distinct modules the culprits ran under (the victims' for violations without a culprit),
  // in order of first sight; empty when the trace names none.
  std::vector<std::string> modules;
};

// A backward function that raised an error no violation explains: PyTorch's message and the node.
struct UnexplainedError {
  OpRef backward_op;                    // The backward function's op; its name is the node's.
  std::string message;                  // PyTorch's, when recorded; empty otherwise.
};

// The error the program ended with, when no violation or unexplained backward error accounts for
// it and it is not the version check's: an exception raised in the forward ("a leaf Variable that
// requires grad is being used in an in-place operation"), a data error. Not a saved tensor's
// story, so torchrr has no verdict on it; a report that said only "nothing was modified" would
// read as a clean run.
struct ProgramError {
  std::string type;     // "RuntimeError"; the exception's type as recorded.
  std::string message;
  OpRef op;             // The op that raised it, when the trace shows one (id 0 otherwise).
};

// Where and why the recorder stopped before the program ended (an internal error, a tensor it
// could not read): ops after that point were not recorded.
struct RecordingStop {
  format::ObjectId op = 0;  // The innermost op running on the thread that stopped, 0 if none.
  uint32_t thread = 0;
  int64_t time_ns = 0;
  std::string message;      // The recorder's reason.
};

// A source file as the trace recorded it (format 1.4): the lines around the frames that name it.
struct RecordedSource {
  uint64_t hash = 0;    // format::SourceHash of the file's bytes; 0 when the trace did not say.
  uint64_t bytes = 0;
  uint32_t lines = 0;
  std::map<uint32_t, std::string> text;  // Line number (1-based) -> the line.
};

// A write into a saved tensor that no violation is made of: a counter reset hid it, and it put
// back what the node saved. FSDP2 frees each unsharded parameter after forward and all-gathers it
// again before backward, into the same tensor under a preserved version counter; the trace shows
// that the bytes came from the same ops over the same sharded parameters, unwritten since the
// save (the evidence: a storage's lineage, replayer/src/content_lineage.h). An optimizer step
// between forward and backward writes those shards, and the refill is then a violation.
struct RestoredWrite {
  NodeRef backward_node;
  SavedTensorRef tensor;
  OpRef writer;                 // The last write before the use, as culprits are named.
  uint64_t backward_pass = 0;
};

// Why the path from trainable parameters (leaves that require grad) toward the loss carries no
// gradient: the op that cut it.
enum class CutCause : uint8_t {
  kNoGrad = 0,               // An op ran under torch.no_grad() (or set_grad_enabled(False)).
  kInferenceMode = 1,        // An op ran under torch.inference_mode(): an inference tensor.
  kDetach = 2,               // detach(): the values go on, the graph does not.
  kItem = 3,                 // .item() or .tolist(): a Python number, made a tensor again.
  kNumpy = 4,                // detach() then .numpy(): the values came back from NumPy.
  kReentrantCheckpoint = 5,  // checkpoint(use_reentrant=True) whose inputs do not require grad:
                             // its forward runs under no_grad, and its output has no grad_fn.
  kNoBackward = 6,           // An op with an input that requires grad, run with grad mode on,
                             // whose output has no autograd node (a kernel or a Function
                             // without backward).
  kNoParameter = 7,          // No recorded op connects the loss to any parameter that requires
                             // grad (every parameter frozen, or its values came from outside).
};
// "no_grad", "inference_mode", "detach", "item", "numpy", "reentrant_checkpoint", "no_backward",
// "no_parameter"
const char* CutCauseName(CutCause cause);

// A trainable parameter (a leaf tensor that requires grad, used by a recorded op) as a report
// names it.
struct CutParameter {
  format::ObjectId id = 0;        // Its tensor id.
  // Its module path and the argument it is ("layers.3.self_attn.q_proj.lora_A.default.weight"),
  // the module's path alone when the op does not say which argument, or "" when no module ran it.
  std::string name;
  std::string module;             // The module that used it, with its class; "" when unknown.
  std::vector<int64_t> shape;
};

// Where the gradient stopped: backward raised "element 0 of tensors does not require grad and
// does not have a grad_fn" (`raised`), or a backward that ran never reached trainable parameters
// (their AccumulateGrad never ran), and the op on the path between them and the loss that cut it.
struct GradientCut {
  CutCause cause = CutCause::kNoGrad;
  // The op that cut the path, at its line; for kReentrantCheckpoint, an op the checkpointed
  // function ran under no_grad; absent for kNoParameter.
  std::optional<OpRef> op;
  // kReentrantCheckpoint: the checkpoint's call (the CheckpointFunction it applied).
  std::optional<OpRef> checkpoint;
  // The raising case: the op that made the tensor backward was called on, as far as the trace
  // shows it (the last op of the forward before the error), and PyTorch's message.
  bool raised = false;
  std::optional<OpRef> loss;
  std::string pytorch_message;
  // The parameters the cut kept from backward: for a backward that ran, those that got no
  // gradient; for one that raised, those used under the cutting op. At most kMaxListed, and how
  // many in all; `summary` groups them ("48 lora_A/lora_B in layers 0-11").
  static constexpr size_t kMaxListed = 64;
  std::vector<CutParameter> parameters;
  uint64_t parameter_count = 0;
  std::string summary;
  uint64_t backward_passes = 0;   // The backward passes that ran without reaching them.
  std::string help;               // What to change, one sentence.
};

// Where the first NaN or Inf that reached a loss, a gradient or a weight came from, by cause.
enum class NonFiniteCause : uint8_t {
  kOverflow = 0,   // A value past its dtype's largest (float16's 65504, bfloat16's 3.4e38).
  kDomain = 1,     // log, sqrt, a division or a power at zero or below.
  kMaskedRow = 2,  // A softmax over a row with no finite score: every score masked to -inf.
  kWhereTrap = 3,  // torch.where's untaken branch: its NaN or Inf multiplies a zero gradient.
  kData = 4,       // The tensor held it when it came into the step (a batch, a buffer, a weight).
  kOptimizer = 5,  // An optimizer's update made a weight non-finite from finite values.
  kOther = 6,      // An op made it from finite inputs, for no reason named above.
};
// "overflow", "domain", "masked_row", "where_trap", "data", "optimizer", "other"
const char* NonFiniteCauseName(NonFiniteCause cause);

// The first NaN or Inf (format 1.16's value ranges): the op that made it from finite inputs (or
// the tensor that brought it in), in the order the ops ran, followed from a loss, a gradient or a
// weight it reached. Values that went non-finite and were removed on the way (a masked fill, a
// torch.where, nan_to_num) reach nothing and are not reported.
struct NonFinite {
  NonFiniteCause cause = NonFiniteCause::kOther;
  bool nan = false;               // What it made: a NaN (else an Inf).
  OpRef op;                       // The op, at its line (kData: the first op that read it).
  bool backward = false;          // The op is a backward node's: `forward` made that node.
  std::optional<OpRef> forward;
  std::optional<OpRef> became_nan;  // Where its Inf turned into a NaN, when another op.
  std::string dtype;              // The output's, "float16".
  double input_max_abs = 0;       // The inputs' largest finite magnitude.
  double dtype_max = 0;           // The dtype's largest finite value; 0 when not floating.
  uint64_t step = 0;              // The step it ran in; UINT64_MAX when unknown.
  std::string reached;            // "the loss", "a gradient", "a weight".
  uint64_t later_ops = 0;         // Ops whose non-finite outputs follow from it.
  uint64_t steps = 0;             // Steps in which a non-finite value reached something.
  std::string help;               // What to change, one sentence.
};

// What the analysis found, and how much it looked at.
struct Report {
  // Every violation. When PyTorch raised, the first one is the one it stopped at; the rest follow
  // in the order autograd met (or would have met) them.
  std::vector<Violation> violations;
  // The violations grouped by kind, culprit line and victim line, in the order of each group's
  // first violation (GroupViolations).
  std::vector<ViolationGroup> groups;
  uint64_t records = 0;
  uint64_t ops = 0;                  // OpRecords.
  uint64_t tensors = 0;
  uint64_t nodes = 0;
  uint64_t node_executions = 0;
  uint64_t backward_passes = 0;      // The program's: backward() and autograd.grad() calls.
  // The passes torch.compile's AOTAutograd ran while tracing a region (its joint graph), not
  // counted in backward_passes.
  uint64_t compile_passes = 0;
  uint64_t version_bumps = 0;        // In-place writes seen (outermost op per write).
  uint64_t data_loss_records = 0;    // Records the recorder said it lost (DataLossRecord).
  uint64_t records_lost = 0;         // How many records those say were lost.
  std::optional<RecordingStop> recording_stopped;
  // Backward functions that threw with no violation to explain it: never "nothing was modified".
  std::vector<UnexplainedError> unexplained_errors;
  // The program's own error, when nothing above explains it; KeyboardInterrupt is not one.
  std::optional<ProgramError> program_error;
  // Uses of saved tensors whose hidden writes put back the saved bytes: how many, and the first
  // few (RestoredWrite).
  uint64_t restored_count = 0;
  std::vector<RestoredWrite> restored;
  // The recording misses part of the run: it stopped early or lost records. Its verdicts cover
  // only what was recorded, and "nothing found" is not a clean bill of health.
  bool incomplete() const { return recording_stopped.has_value() || data_loss_records != 0; }
  // The steps the trace holds (StepRecords, format 1.5): none in a trace that marks no steps.
  uint64_t steps = 0;
  uint64_t first_step = 0;
  uint64_t last_step = 0;
  // A window of the run (--keep-last): the steps before first_step were not kept, so "nothing
  // found" covers only the kept ones.
  bool window() const { return steps != 0 && first_step != 0; }
  // What the analysis could not be sure of (nodes with unknown saved sets, lost records, a
  // PyTorch version error the trace does not explain), one line each.
  std::vector<std::string> warnings;
  // The source the trace carries, by path as its frames name it; empty for traces before 1.4 and
  // those recorded with --no-source or redacted with --drop-source.
  std::map<std::string, RecordedSource> sources;
  // Where the gradient stopped (GradientCut), in the order found; empty when every trainable
  // parameter a backward could reach got its gradient.
  std::vector<GradientCut> gradient_cuts;
  // The first NaN or Inf, when one reached a loss, a gradient or a weight outside the steps a
  // GradScaler skipped.
  std::optional<NonFinite> non_finite;
  // Steps whose gradients a GradScaler found non-finite and skipped (its scale calibrating).
  uint64_t scaler_skipped_steps = 0;
  // The trace has value ranges (format 1.16, recorded with the finiteness check on).
  bool ranges_recorded = false;
};

// The streaming analysis: feed records in file order, then Finish(). Memory grows with the
// tensors, nodes and in-place writes of the trace, not with its ops: records are not kept.
// Records may be malformed (a truncated or corrupt trace): unknown ids are skipped, never trusted.
// Not thread-safe: one thread feeds one Analyzer.
class Analyzer {
 public:
  Analyzer();
  ~Analyzer();
  Analyzer(const Analyzer&) = delete;
  Analyzer& operator=(const Analyzer&) = delete;

  void Add(const format::Record& record);
  // The torch that recorded the trace (its FileInfo's torch_version, "2.15.0+cu130"), so that the
  // report words what PyTorch's messages say as that torch words them (PytorchNodeName). Unset or
  // unparsable: as the torch releases before that wording changed.
  void SetRecordingTorch(std::string_view torch_version);
  // Ends the trace: runs what is pending (the last backward pass) and builds the report.
  // Call once; later Add() calls are ignored.
  Report Finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// How PyTorch's "which is output N of <node>" names the autograd node `node_name` when the
// recording torch is `torch_version`: the node's own name (SigmoidBackward0) before 2.13; from
// 2.13 on, the forward op's (Sigmoid; AddBackward1 is Add1; a Python Function's FBackward is F):
// the name without a last "Backward" followed by digits only, and without the digits when they
// are "0". Names without that suffix (CopySlices) are kept.
std::string PytorchNodeName(std::string_view node_name, std::string_view torch_version);

// Where the reports may read this machine's file for a frame whose code the trace does not carry
// (--no-source, an older trace, a frame outside the user's code): only a source file, by its
// extension (.py, .cc, .h, .cu, ...), under one of `roots` after realpath; by default (never set,
// or empty) the working directory. A trace is untrusted input: without this, a stranger's trace
// naming ~/.ssh/id_rsa would have that file's lines printed into a report meant to be shared.
// What the trace carries is quoted from the trace; a local copy is then read only to compare.
// Call before formatting, from one thread (the command line does, from --source-root).
void SetLocalSourceRoots(std::vector<std::string> roots);

// Analyzes records already in memory. Same result as feeding them to an Analyzer.
Report Analyze(const std::vector<format::Record>& records);

// Groups `violations` (ViolationGroup): what Analyzer::Finish puts in Report::groups.
std::vector<ViolationGroup> GroupViolations(const std::vector<Violation>& violations);

// "0-19", "3, 5, 7-9": ascending numbers as ranges.
std::string NumberRanges(const std::vector<uint64_t>& numbers);
// A group's modules in few words: "layers.0-1.mlp (LlamaMLP)" when they differ only in one
// index, else the first three and how many more.
std::string ModuleRanges(const std::vector<std::string>& modules);

// The human report, one compiler-style diagnostic per violation (ANSI colours when `color`).
// Source lines are quoted from the trace (Report::sources), else from the recorded path when it is a
// regular source file readable on this machine under the local source roots (SetLocalSourceRoots),
// of at most 8 MiB; never a special or kernel file (a FIFO, a device, /proc), whatever the trace
// names. A file here that differs from the recorded one is said so once, and so is a file not
// quoted because it is outside the roots or no source file.
// Violations of one group (Report::groups) are one diagnostic, the first, with how many there
// were and in which steps; `each` prints every violation instead (`replay --all`).
// Ends with a summary line; says "no saved tensor was modified" when there is nothing to report.
std::string FormatText(const Report& report, bool color, bool each = false);
// The verdict `torchrr record` prints after the program ends: each distinct culprit and victim
// line (at most three) with the code the trace carries, the fix, and the commands that show the
// rest for `trace`; "" when the report has no violation.
std::string FormatShortVerdict(const Report& report, const std::string& trace);
// Whether `torchrr fix` has a rewrite to try for `v`, and in which language: a culprit whose user
// line is Python or C++; for a freed graph or an unpack hook, Python only (the fix verb has no C++
// rule for them). The fix verb's parser may still find the line's rewrite uncertain and list
// choices instead.
enum class FixLanguage : uint8_t { kNone, kPython, kCpp };
FixLanguage FixVerbMayPatch(const Violation& v);
// The line `replay` and the short verdict end with when a violation of `report` passes
// FixVerbMayPatch: "try: torchrr fix run.trr --check (...)\n", saying that the check re-runs
// the program for a Python line, and that it builds the program again first for C++ lines only;
// where no culprit passes and one is a C++ function without file and line (a program built
// without debug info), a note saying how to have its line; "" otherwise.
std::string FixVerbLine(const Report& report, const std::string& trace);

// The JSON report; the schema is replayer/SCHEMA.md (kSchemaVersion).
inline constexpr int kSchemaVersion = 1;
nlohmann::json ToJson(const Report& report);

// Tensor metadata helpers, shared with the CLI and the tests.
const char* DTypeName(format::DType dtype);     // "float32"; "unknown" past the table.
size_t DTypeSize(format::DType dtype);          // Bytes per element; 0 when unknown.
std::string DeviceName(const format::Device& device);  // "cpu", "cuda:0"

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_REPLAYER_H_
