// The records of a torchrr trace, as plain C++ values.
//
// The recorder fills these and hands them to TraceWriter; the reader gives them back. How they are
// laid out on disk (FlatBuffers tables in checksummed zstd chunks) is the codec's business, not the
// caller's: see format/SPEC.md. Every field here has a meaning the replayer relies on, and every
// later version keeps it (fields are appended, never removed).
//
// Identities. Tensors, storages, version counters, autograd nodes and ops each get an ObjectId from
// one counter per trace, in the order the recorder first sees them. An id is never reused for a
// different object within a trace, even when the memory behind the object is (0 means "none"),
// except a storage's: it names one storage at a time, and may be given to a later storage at the
// same address once the first was freed (SPEC.md, Ids).
// Strings, frames and stacks are interned: defined once by a StringDef / FrameDef / StackDef record
// that precedes every record referring to them, and referenced by a small InternId (0 means "none").
//
// Every struct's members are listed once more, in record_fields.h, which the codecs, the JSON and
// the tests walk: a member added here is added there too (the build says so), and to trace.fbs.
#ifndef TORCHRR_FORMAT_RECORDS_H_
#define TORCHRR_FORMAT_RECORDS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace torchrr::format {

using ObjectId = uint64_t;
using InternId = uint32_t;

// Who wrote the trace. Carried by the first chunk of every file.
struct FileInfo {
  std::string torchrr_version;
  std::string torch_version;
  std::string cuda_version;  // Empty when the writer had no CUDA.
  std::string host;
  int64_t pid = 0;
  int32_t rank = -1;             // Distributed rank; -1 when not distributed.
  int32_t world_size = 0;        // 0 when not distributed.
  int64_t start_time_unix_ns = 0;
  std::vector<std::string> command_line;
  bool operator==(const FileInfo&) const = default;
};

// An interned string: op names, overloads, file, function and library names, messages.
struct StringDef {
  InternId id = 0;
  std::string text;
  bool operator==(const StringDef&) const = default;
};

enum class FrameKind : uint8_t { kNative = 0, kPython = 1 };

// One stack frame, symbolized. For native frames `pc` is the return address in the recording
// process (meaningless elsewhere, kept to tell frames apart); function/file/line come from the
// symbolizer and may be 0 when unknown.
struct FrameDef {
  InternId id = 0;
  FrameKind kind = FrameKind::kNative;
  uint64_t pc = 0;
  InternId function = 0;  // StringDef id.
  InternId file = 0;      // StringDef id: the path as the recorded program saw it.
  uint32_t line = 0;
  InternId library = 0;   // StringDef id: shared object (native) or module (Python).
  bool framework = false; // torch, the C++ runtime, the standard library, or torchrr itself.
  // A Python frame in code that torch generated from the user's (torch.fx's `<eval_with_key>.N`
  // modules, which torch.compile runs): the FrameDef of the user's line that this generated line
  // was traced from (format 1.6), or 0.
  InternId origin = 0;
  bool operator==(const FrameDef&) const = default;
};

// A whole stack, innermost frame first.
struct StackDef {
  InternId id = 0;
  std::vector<InternId> frames;  // FrameDef ids.
  bool operator==(const StackDef&) const = default;
};

// c10::ScalarType values, stored as their integer (stable across torch versions for the ones in use).
using DType = int8_t;

struct Device {
  int8_t type = 0;    // c10::DeviceType: 0 CPU, 1 CUDA, ...
  int8_t index = -1;  // -1 when the device has no index.
  bool operator==(const Device&) const = default;
};

// A snapshot of a tensor's metadata. Written when the recorder first sees a tensor and again
// whenever any field changes (an in-place op gives it a new grad_fn, resize_ changes its shape,
// requires_grad_() flips), so the last TensorInfo before a record is the tensor's state then.
struct TensorInfo {
  ObjectId tensor = 0;
  ObjectId storage = 0;           // Same storage => same id (views, .data, detach()); storages
                                  // alive together have distinct ids (SPEC.md, Ids).
  ObjectId version_counter = 0;   // Same counter => same id (views, detach(); not .data). 0: none
                                  // (inference tensors and tensors without autograd metadata).
  DType dtype = 0;
  Device device;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  bool requires_grad = false;
  bool is_leaf = true;
  ObjectId grad_fn = 0;           // NodeRecord id, 0 for leaves and tensors without history.
  uint32_t output_nr = 0;         // Which output of grad_fn this tensor is.
  uint64_t storage_nbytes = 0;
  // The storage's data pointer in the recorded process (format 1.1), written with --verify-saved
  // only, else 0: two storages over the same memory (from_blob, DLPack) alias each other.
  uint64_t storage_address = 0;
  // For a wrapper tensor subclass (DTensor, whose data is another tensor: `__tensor_flatten__`),
  // the tensor it wraps, first of those it names (format 1.9); 0 for any other tensor. A write
  // through the inner tensor is a write into the wrapper's data that the wrapper's version counter
  // does not see.
  ObjectId inner = 0;
  bool operator==(const TensorInfo&) const = default;
};

// One tensor argument or output of an op, with its version counter's value at the op's start and
// at its end: an op with version_after != version_before wrote the tensor (or something sharing its
// counter) in place.
struct TensorUse {
  ObjectId tensor = 0;
  uint32_t version_before = 0;
  uint32_t version_after = 0;
  uint16_t position = 0;     // Argument index in the op's schema (outputs: return index).
  uint16_t list_index = kNotInList;  // Index within a Tensor[] argument.
  static constexpr uint16_t kNotInList = 0xffff;
  bool operator==(const TensorUse&) const = default;
};

// What a finiteness check saw in one tensor (1.16): whether it holds a NaN, a +Inf or a -Inf, and
// the largest magnitude of its finite elements. `flags` 0 is a tensor that was not checked (not
// floating, on a device the recorder does not scan, or too large to read in time).
struct ValueRange {
  static constexpr uint8_t kChecked = 1;
  static constexpr uint8_t kNan = 2;
  static constexpr uint8_t kPosInf = 4;
  static constexpr uint8_t kNegInf = 8;
  static constexpr uint8_t kNonFinite = kNan | kPosInf | kNegInf;
  uint8_t flags = 0;
  // Rounded to float and clamped to its largest value: the verdict quotes two digits of it.
  float max_abs = 0;
  bool checked() const { return (flags & kChecked) != 0; }
  bool finite() const { return (flags & kNonFinite) == 0; }
  bool operator==(const ValueRange&) const = default;
};

// A collective (c10d's, or a functional one): its outputs' bytes arrive at the work's wait(),
// after the op ended.
inline bool IsCollectiveOp(std::string_view name) {
  return name.starts_with("c10d::") || name.starts_with("_c10d_functional::");
}
// Ops whose outputs are memory not yet written when they end, and so have no ValueRanges:
// allocations (aten::empty*, aten::new_empty*) and collectives (SPEC.md, "Value ranges").
inline bool HasUnwrittenOutputs(std::string_view name) {
  return name.starts_with("aten::empty") || name.starts_with("aten::new_empty") ||
         IsCollectiveOp(name);
}

enum class ValueKind : uint8_t {
  kNone = 0, kBool = 1, kInt = 2, kDouble = 3, kString = 4, kIntList = 5, kDoubleList = 6,
  kDType = 7, kDevice = 8, kLayout = 9, kMemoryFormat = 10, kOther = 11, kBoolList = 12,
  kComplex = 13,
};

// A non-tensor argument: numbers, bools, lists, strings, None, dtypes, devices.
struct Value {
  uint16_t position = 0;
  ValueKind kind = ValueKind::kNone;
  int64_t i = 0;           // kBool, kInt, kDType, kLayout, kMemoryFormat; kDevice: type*256+index.
  double d = 0;            // kDouble; real part of kComplex.
  double d_imag = 0;       // Imaginary part of kComplex.
  InternId s = 0;          // kString; kOther: the IValue's type name.
  std::vector<int64_t> ints;     // kIntList, kBoolList.
  std::vector<double> doubles;   // kDoubleList.
  bool operator==(const Value&) const = default;
};

enum class OpScope : uint8_t {
  kFunction = 0,          // An ATen op.
  kBackwardFunction = 1,  // An autograd node running in backward (name is the node's name).
  kUserScope = 2,         // A user's record_function() range.
  kOther = 3,
};

// One op: an ATen op, an autograd node's execution, or a user scope. Written at the op's end.
struct OpRecord {
  ObjectId op = 0;
  InternId name = 0;            // "aten::add_"
  InternId overload = 0;        // "Tensor"; 0 for the default overload.
  ObjectId parent = 0;          // The op this one ran inside (same thread), 0 at top level.
  uint32_t thread = 0;          // RecordFunction's logical thread id.
  OpScope scope = OpScope::kFunction;
  int64_t sequence_nr = -1;     // Autograd sequence number (forward ops that create nodes and
                                // backward functions), -1 when none.
  uint64_t forward_thread = 0;  // For backward functions: the forward op's thread id.
  int64_t start_ns = 0;         // Steady clock.
  int64_t end_ns = 0;
  InternId stack = 0;           // StackDef id, 0 when stacks are off.
  bool threw = false;           // Ended by an exception.
  bool grad_mode = true;        // GradMode at the op's start.
  std::vector<TensorUse> inputs;
  std::vector<TensorUse> outputs;
  std::vector<Value> values;    // Non-tensor arguments.
  // StringDef id: the nn.Module the op ran under, "layers.1.mlp.act_fn (SiLU)" (its path from the
  // outermost module running, then its class), "(Net)" for that outermost one; 0 when none or
  // not known (1.8).
  InternId module_path = 0;
  // What the finiteness check saw in each input and output (1.16): parallel to `inputs` and
  // `outputs`, or empty where the op's tensors were not checked.
  std::vector<ValueRange> input_ranges;
  std::vector<ValueRange> output_ranges;
  bool operator==(const OpRecord&) const = default;
};

struct Edge {
  ObjectId node = 0;     // 0: an undefined edge (the input needs no gradient).
  uint32_t input_nr = 0;
  bool operator==(const Edge&) const = default;
};

// A tensor an autograd node saved for backward (a SavedVariable), as it was at save time.
// What a saved-tensor hook (torch.autograd.graph.saved_tensors_hooks) made of a saved tensor.
enum class SavedHook : uint8_t {
  kNone = 0,          // No hook.
  kOpaque = 1,        // A hook packed something the recorder cannot follow.
  kPackedTensor = 2,  // The hook packed a tensor (`tensor` names it): the tensor itself, or a copy.
  kCheckpoint = 3,    // Activation checkpointing: recomputed in backward from `recompute_from`.
};

struct SavedTensor {
  InternId name = 0;             // The member as autograd declares it: "self", "result", "other".
  uint32_t list_index = TensorUse::kNotInList;  // For std::vector<SavedVariable> members.
  ObjectId tensor = 0;           // The tensor as the recorded program saw it (the op's argument or
                                 // output), when known.
  ObjectId storage = 0;
  ObjectId version_counter = 0;
  uint32_t saved_version = 0;    // The version autograd will compare against at unpack.
  bool is_output = false;        // Saved an output of the node's own op.
  bool defined = true;           // False for an undefined (None) saved tensor.
  bool has_hooks = false;        // Saved-tensor hooks: PyTorch skips the version check.
  bool is_leaf = false;
  uint32_t output_nr = 0;
  SavedHook hook = SavedHook::kNone;
  // False where PyTorch will not compare versions at unpack: saved-tensor hooks, or a tensor that
  // torch.compile's AOTAutograd saved without a version check. A write in between is then a
  // silently wrong gradient, not an error.
  bool checked = true;
  // kCheckpoint: the node whose saved tensors (the checkpointed call's inputs) backward reads,
  // with their version check, to recompute this one.
  ObjectId recompute_from = 0;
  // Saved through hooks that Python functions define: the StackDef of one Python frame, the unpack
  // hook's definition (its code's file, first line and qualified name), which decides what
  // backward gets back. 0 otherwise (C++ hooks, checkpointing's own, traces before 1.3).
  InternId unpack_hook = 0;
  // Where backward uses it, when that is known apart from the node's creation (format 1.7): for a
  // torch.compile region's node, the StackDef of Python frames (innermost first, no native ones)
  // of the user's line whose forward op the first backward graph node reading this tensor
  // belongs to, as torch.fx's traceback names it. 0 otherwise.
  InternId used_at = 0;
  bool operator==(const SavedTensor&) const = default;
};

enum class SavedSetKind : uint8_t {
  kExact = 0,      // Read from the node's own SavedVariables (generated nodes, known C++ nodes).
  kNone = 1,       // The node type saves nothing.
  kCustom = 2,     // A custom autograd Function: saved what ctx.save_for_backward was given.
  kUnknown = 3,    // A node type the recorder cannot look inside; saved list may be incomplete.
};

// An autograd node, written when the recorder first sees it (at the end of the op that created
// it, or when reached through another node's edges).
struct NodeRecord {
  ObjectId node = 0;
  InternId name = 0;             // "SigmoidBackward0"
  uint64_t forward_thread = 0;   // With sequence_nr, the key the backward pass carries.
  int64_t sequence_nr = -1;
  // OpRecord id of the op that created it: the op whose end first saw it, or, for a node first
  // seen later, the op that spanned its sequence number (for a C++ custom Function, whose apply
  // is not an op, the first op its forward ran); 0 if unknown.
  ObjectId created_by = 0;
  ObjectId variable = 0;         // AccumulateGrad: the leaf tensor it accumulates into.
  SavedSetKind saved_kind = SavedSetKind::kExact;
  std::vector<Edge> edges;
  std::vector<SavedTensor> saved;
  bool operator==(const NodeRecord&) const = default;
};

// What a saved_tensors_hooks unpack hook handed backward for a saved tensor, when its dtype or
// shape is not the saved tensor's: PyTorch checks neither, and backward may compute a wrong
// gradient without an error (the engine casts every gradient back to its input's dtype).
struct UnpackedTensor {
  uint32_t saved = 0;                // Index in the node's NodeRecord.saved.
  DType dtype = 0;                   // What the hook returned.
  std::vector<int64_t> shape;
  DType saved_dtype = 0;             // Of the tensor the node saved.
  std::vector<int64_t> saved_shape;
  bool operator==(const UnpackedTensor&) const = default;
};

// A node's execution in a backward pass. The op record of the same execution carries the timing
// and the thread; this ties it to the node.
struct NodeExecRecord {
  ObjectId node = 0;
  ObjectId op = 0;               // The OpRecord (scope kBackwardFunction) of this execution.
  uint32_t thread = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool threw = false;
  std::vector<UnpackedTensor> unpacked;  // Unpack hooks' tensors that differ from the saved ones.
  bool operator==(const NodeExecRecord&) const = default;
};

enum class ErrorKind : uint8_t {
  kCppException = 0,     // A C++ exception thrown inside a recorded op.
  kPythonException = 1,  // The script's uncaught Python exception.
  kUncaught = 2,         // std::terminate with an exception.
  kRecorder = 3,         // The recorder's own trouble (it stopped recording).
};

struct ErrorRecord {
  ErrorKind kind = ErrorKind::kCppException;
  ObjectId op = 0;               // Innermost recorded op the error came out of, 0 if none.
  uint32_t thread = 0;
  int64_t time_ns = 0;
  InternId type = 0;             // "c10::Error", "RuntimeError".
  std::string message;
  InternId stack = 0;
  bool operator==(const ErrorRecord&) const = default;
};

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  bool operator==(const Dim3&) const = default;
};

struct CudaKernelRecord {
  InternId name = 0;
  ObjectId op = 0;               // The op that launched it (external correlation), 0 if outside.
  int8_t device = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  int64_t start_ns = 0;          // GPU clock, converted to the trace's clock when possible.
  int64_t end_ns = 0;
  Dim3 grid;
  Dim3 block;
  uint32_t shared_memory = 0;
  uint32_t registers = 0;
  bool operator==(const CudaKernelRecord&) const = default;
};

enum class CudaCopyKind : uint8_t {
  kUnknown = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3, kMemset = 4,
  kPeer = 5, kOther = 6,
};

struct CudaMemcpyRecord {
  CudaCopyKind kind = CudaCopyKind::kUnknown;
  ObjectId op = 0;
  int8_t device = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t bytes = 0;
  uint32_t memset_value = 0;
  bool operator==(const CudaMemcpyRecord&) const = default;
};

// What the recorder could not keep: the records are gone, this says how many and why.
struct DataLossRecord {
  uint64_t records = 0;
  uint64_t bytes = 0;
  int64_t first_ns = 0;
  int64_t last_ns = 0;
  std::string reason;
  bool operator==(const DataLossRecord&) const = default;
};

enum class FingerprintWhen : uint8_t { kAtSave = 0, kAtUse = 1 };

// A 64-bit hash of a storage's bytes (kernels/), for writes that bypass version counters.
struct FingerprintRecord {
  ObjectId node = 0;
  InternId saved_name = 0;
  uint32_t list_index = TensorUse::kNotInList;
  ObjectId storage = 0;
  ObjectId tensor = 0;
  FingerprintWhen when = FingerprintWhen::kAtSave;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t hash = 0;
  int64_t time_ns = 0;
  bool operator==(const FingerprintRecord&) const = default;
};

// A source file that the trace's stacks name in user code (1.4), as the writer read it: the
// replayer quotes the file's lines from the trace (SourceLines), and says where the file on its own
// machine differs (another hash).
struct SourceFile {
  InternId file = 0;       // StringDef id: the path, as FrameDef.file names it.
  uint64_t hash = 0;       // XXH64, seed 0, of the file's bytes (`xxhsum -H64` prints it).
  uint64_t bytes = 0;      // The file's size.
  uint32_t lines = 0;      // Its number of lines.
  bool operator==(const SourceFile&) const = default;
};

// Consecutive lines of a SourceFile, written around the lines that frames name (1.4). Each line of
// a file is written at most once in a trace; a reader keeps every SourceLines of a file.
struct SourceLines {
  InternId file = 0;                // StringDef id, as SourceFile.file.
  uint32_t first_line = 0;          // 1-based number of text[0].
  std::vector<std::string> text;    // Without their line breaks.
  bool operator==(const SourceLines&) const = default;
};

// The start of a training step (1.5): the records after it, up to the next StepRecord, are that
// step's (SPEC.md, Steps). Written where the recorder keeps only some steps (--keep-last), and
// where the program marks its steps itself (torchrr.step()). A trace whose first StepRecord has
// `step` above 0 holds only the steps from there: earlier ones were not kept.
struct StepRecord {
  uint64_t step = 0;        // 0-based, counted from the start of the recording.
  int64_t time_ns = 0;      // When the step started: its first op's start.
  bool marked = false;      // The program marked it (torchrr.step()); else the recorder found it.
  bool operator==(const StepRecord&) const = default;
};

using Record = std::variant<StringDef, FrameDef, StackDef, TensorInfo, OpRecord, NodeRecord,
                            NodeExecRecord, ErrorRecord, CudaKernelRecord, CudaMemcpyRecord,
                            DataLossRecord, FingerprintRecord, SourceFile, SourceLines,
                            StepRecord>;

// The record kind's name, as `torchrr info` and `dump --json` print it ("op", "tensor", ...).
const char* RecordKindName(const Record& record);
// Number of record kinds (the size of Record's alternatives).
inline constexpr size_t kRecordKindCount = std::variant_size_v<Record>;
// Name of the record kind with the given variant index; "unknown" past the end.
const char* RecordKindNameAt(size_t index);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_RECORDS_H_
