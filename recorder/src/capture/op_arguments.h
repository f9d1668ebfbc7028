// What an op's arguments and results become in its OpRecord: tensors as TensorUses (ids and the
// versions before and after the op), everything else as Values.
//
// Not thread-safe: the session calls the functions that take the registry or the interner with
// its mutex held.
#ifndef TORCHRR_RECORDER_OP_ARGUMENTS_H_
#define TORCHRR_RECORDER_OP_ARGUMENTS_H_

#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include "capture/id_registry.h"
#include "capture/interner.h"
#include "session/thread_state.h"

namespace torchrr::recorder {

// The op's inputs. A RecordFunction started without them (some redispatched ops) has none; a torch
// header built without NDEBUG asserts on that instead of returning an empty list.
c10::ArrayRef<const c10::IValue> InputsOf(const at::RecordFunction& fn);

// Calls `f` on each tensor among an op's inputs: a tensor, a tensor list's, a list's.
template <typename F>
void ForEachInputTensor(c10::ArrayRef<const c10::IValue> inputs, F&& f) {
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      f(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor t : v.toTensorList()) f(t);
    } else if (v.isList()) {
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor()) f(item.toTensor());
      }
    }
  }
}

// Fills frame.op's inputs (tensors, with their versions now, also read as version_after until the
// op ends) and values (the other arguments), and frame.input_counters. Definitions and
// TensorInfos go to frame.before; a wrapper's names the tensor `inners` says it wraps (nullptr:
// none was read, the op has no wrapper subclass among its tensors).
void RecordInputs(c10::ArrayRef<const c10::IValue> inputs, OpFrame& frame, IdRegistry& ids,
                  Interner& interner, const WrapperInners* inners);

// The defined tensors among an op's outputs, in order, with the positions they came from.
void CollectOutputs(const std::vector<c10::IValue>& outputs, std::vector<OpOutput>& collected);

// Fills frame.op's outputs from `outputs` (their ids, also into each OpOutput, and versions: an
// in-place op returns its input, whose version before is the input's). TensorInfos go to `out`,
// as in RecordInputs.
void RecordOutputs(std::vector<OpOutput>& outputs, OpFrame& frame, IdRegistry& ids,
                   EncodedRecords& out, const WrapperInners* inners);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_OP_ARGUMENTS_H_
