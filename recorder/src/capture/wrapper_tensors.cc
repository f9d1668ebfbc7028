#include "capture/wrapper_tensors.h"

#include "capture/op_arguments.h"
#include "python/python_nodes.h"

namespace torchrr::recorder {

void ReadWrapperInner(const at::Tensor& t, WrapperInners& out) {
  if (!MayWrap(t) || FindInner(out, t.unsafeGetTensorImpl()) != nullptr) return;
  static auto read = TORCHRR_PYTHON_NODES_FUNCTION(torchrr_read_inner_tensor);
  if (read == nullptr) return;  // Not inside Python: no subclass either.
  at::Tensor inner;
  read(t, &inner);
  if (inner.defined()) out.push_back({t.unsafeGetTensorImpl(), std::move(inner)});
}

void ReadWrapperInners(c10::ArrayRef<const c10::IValue> inputs, WrapperInners& out) {
  ForEachInputTensor(inputs, [&](const at::Tensor& t) { ReadWrapperInner(t, out); });
}

const at::Tensor* FindInner(const WrapperInners& inners, const c10::TensorImpl* wrapper) {
  for (const WrapperInner& w : inners) {
    if (w.wrapper == wrapper) return &w.inner;
  }
  return nullptr;
}

}  // namespace torchrr::recorder
