// Which ops the recorder records, and what kind of op each is.
//
// A step dispatches about three times as many ops as the program calls: kernels run ops below
// autograd, backward formulas run ATen ops, and autograd's engine wraps every node it runs. Those
// that can neither create an autograd node nor bump a version counter say nothing the replayer
// needs that the op around them does not: they are folded into it (SPEC.md, Which ops).
#ifndef TORCHRR_RECORDER_OP_FILTER_H_
#define TORCHRR_RECORDER_OP_FILTER_H_

#include <cstdint>

#include <ATen/record_function.h>

#include "session/thread_state.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

// Whether `fn`, starting now on the thread of `ts`, is folded into the op around it:
// - ops a kernel runs below autograd: the enclosing kernel (autograd's, or the ADInplaceOrView
//   kernel of an in-place or view op) excluded ADInplaceOrView and the autograd keys. Inference
//   mode and _AutoDispatchBelowAutograd (custom ops' autograd) exclude only the autograd keys:
//   their ops can still bump versions, and are recorded;
// - the ops of a backward formula (inside a backward function, grad mode off: no create_graph)
//   that write none of their arguments. Those that write (a gradient accumulated in place, a hook's
//   or a custom backward's in-place op) are recorded;
// - ops that write none of their arguments and return no tensor (item's _local_scalar_dense): with
//   no tensor out, they create no node either.
// Only ATen ops inside a recorded ATen op or backward function are ever folded.
bool FoldedIntoTheOpAround(const at::RecordFunction& fn, ThreadState& ts);

// The wrapper autograd's engine runs each node in ("autograd::engine::evaluate_function:
// MmBackward0", a C++ RECORD_FUNCTION with no sequence number): around the node's backward
// function and its hooks.
bool IsEngineWrapper(const at::RecordFunction& fn, format::OpScope scope, int64_t sequence_nr);

// The range torch.compile puts around each run of a compiled frame ("Torch-Compiled Region: 0/0",
// torch._dynamo's _RecordFunctionFast).
bool IsCompiledRegion(const char* name);

format::OpScope ScopeOf(at::RecordScope scope);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_OP_FILTER_H_
