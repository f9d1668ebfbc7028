// Wrapper tensor subclasses: which tensor each wraps.
//
// A DTensor is a wrapper subclass: its TensorImpl has a storage that holds no bytes and a version
// counter of its own, and its data is another tensor (`_local_tensor`, the shard). An op that
// saves a DTensor saves the wrapper; a write through the shard (`to_local()` under no_grad, then
// an in-place op) moves the shard's counter, not the wrapper's, so autograd's check passes and
// backward reads changed data. The trace ties the two (TensorInfo.inner) so that the replayer
// sees that write.
//
// Which tensor a subclass wraps is only known to Python (`__tensor_flatten__`), so it is read
// under the GIL, before the session's lock is taken, for the tensors of the op being recorded
// that carry the Python dispatch key (subclasses with __torch_dispatch__; nn.Parameter has none).
#ifndef TORCHRR_RECORDER_WRAPPER_TENSORS_H_
#define TORCHRR_RECORDER_WRAPPER_TENSORS_H_

#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace torchrr::recorder {

// A wrapper among an op's tensors and the tensor it wraps.
struct WrapperInner {
  const c10::TensorImpl* wrapper = nullptr;
  at::Tensor inner;
};
using WrapperInners = std::vector<WrapperInner>;

// Whether `t` may wrap another tensor (a Python subclass with __torch_dispatch__). Cheap.
inline bool MayWrap(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python);
}

// Appends what `t` wraps to `out`, when it is a wrapper and not there yet. Takes the GIL when
// MayWrap(t): call it holding no lock a thread holding the GIL could wait for. Never throws.
void ReadWrapperInner(const at::Tensor& t, WrapperInners& out);

// ReadWrapperInner for each tensor among an op's inputs (a tensor, a tensor list's, a list's).
void ReadWrapperInners(c10::ArrayRef<const c10::IValue> inputs, WrapperInners& out);

// The tensor `wrapper` wraps, from `inners`; nullptr when not there.
const at::Tensor* FindInner(const WrapperInners& inners, const c10::TensorImpl* wrapper);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_WRAPPER_TENSORS_H_
