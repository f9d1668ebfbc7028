// How a recorded op becomes a line of Python: its ATen overload, its arguments as literals, and
// the context it ran under that the trace shows (autocast). A trace is untrusted and the script is
// run, so only identifiers, numbers and known names are ever written; anything else is refused.
#ifndef TORCHRR_REPLAYER_REPRO_PYTHON_CALL_H_
#define TORCHRR_REPLAYER_REPRO_PYTHON_CALL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "repro/repro_slice.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer::repro {

// The Python call of a recorded op, "aten.mul_.Tensor"; "" for an op outside aten, or a name that
// is no identifier.
std::string AtenOverload(const format::OpRecord& op, const TraceIndex& index);
// Whether `text` is a Python identifier of ASCII letters, digits and underscores. A trace is
// untrusted and the script is run: a name of anything else could be code.
bool Identifier(std::string_view text);
// The script's name of a tensor: "t14".
std::string Var(ObjectId tensor);
// "[4, 8]"; with `as_bools`, "[True, False]".
std::string Ints(const std::vector<int64_t>& values, bool as_bools = false);
// "torch.float32".
std::string TorchDType(format::DType dtype);
// Where a recorded device runs in the script: "'cpu'" stays, any other is "DEVICE".
std::string DeviceExpr(const format::Device& device);
// Whether a made-up leaf is drawn contiguous: it is, or its strides cannot be drawn (a zero
// stride, an expand's, whose elements share memory that the copy into it refuses).
bool PlainLayout(const format::TensorInfo& info);

// The statements that run one op: `t14 = call(aten.mm.default, t6, t2)[0]` (the script's `call`
// helper binds the arguments to the overload's schema and returns its outputs flat). Returns ""
// and sets *why, one line, when the op is not an ATen op or an argument cannot be written.
std::string OpCall(const format::OpRecord& op, const TraceIndex& index, std::string* why);

// The `torch.autocast(...)` an op ran under, "" when none shows: autocast casts inside the op the
// user called, so the trace shows that op turning float32 operands into a float16 or bfloat16
// result with no dtype argument asking for it.
std::string AutocastOf(const format::OpRecord& op, const TraceIndex& index);

// A stand-in for `op`, which created the custom node `node` (an autograd.Function's apply, a
// compiled region's, activation checkpointing's reentrant Function), whose body the script cannot
// call: a class of the node's Function name (so PyTorch's message names the same grad_fn) whose
// forward returns seeded tensors of the recorded outputs' metadata and saves what the node saved
// (the inputs, the outputs, views of either, or made-up tensors of its own), and whose backward
// (`standin_backward`, kStandInHelpers) reads them back, where PyTorch checks their versions.
// Returns the class and the statement that calls it; "" and sets *why, one line, when the save
// of the version counter `counter` (the violation's) cannot be kept.
std::string StandInCall(const format::OpRecord& op, const format::NodeRecord& node,
                        const TraceIndex& index, ObjectId counter, std::string* why);
// A stand-in for `op`, an op outside aten with no custom node (a torch.library or C++ extension
// op, whose code the script does not have): its outputs made as seeded tensors of the recorded
// metadata, and each input it wrote written in place (`standin_write`) once per recorded version bump, so that backward sees the versions
// it saw. Returns the statements; "" and sets *why, one line, when an output's metadata is not
// in the trace.
std::string ForeignCall(const format::OpRecord& op, const TraceIndex& index, std::string* why);
// The helpers a script with a stand-in carries: `output`, `standin_backward`, `standin_write`.
extern const char* const kStandInHelpers;

// `lines` with each non-empty line prefixed by `by`; every line ends with a line break.
std::string Indent(const std::string& lines, const std::string& by);

}  // namespace torchrr::replayer::repro

#endif  // TORCHRR_REPLAYER_REPRO_PYTHON_CALL_H_
