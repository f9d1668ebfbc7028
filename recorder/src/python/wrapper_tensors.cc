// Wrapper tensor subclasses: the tensor a DTensor (or any subclass that flattens itself) wraps.
#include <torch/csrc/autograd/python_variable.h>

#include "python/python_nodes.h"
#include "python/python_util.h"

using torchrr::recorder::python::GilAndErrorGuard;
using torchrr::recorder::python::PythonUsable;

namespace {

// The first tensor `self`'s type flattens it into, as a new reference; nullptr when it has no
// `__tensor_flatten__` or that names no tensor. Holds the GIL; may leave a Python error set.
PyObject* FirstFlattenedTensor(PyObject* self) {
  // Looked up on the type without raising: most subclasses with the Python key (FakeTensor,
  // FunctionalTensor) have none, and an exception per op would cost more than the lookup.
  static PyObject* const kFlatten = PyUnicode_InternFromString("__tensor_flatten__");
  if (kFlatten == nullptr || _PyType_Lookup(Py_TYPE(self), kFlatten) == nullptr) return nullptr;
  PyObject* flattened = PyObject_CallMethodNoArgs(self, kFlatten);
  if (flattened == nullptr || !PyTuple_Check(flattened) || PyTuple_GET_SIZE(flattened) < 1) {
    Py_XDECREF(flattened);
    return nullptr;
  }
  PyObject* names = PyTuple_GET_ITEM(flattened, 0);  // Borrowed.
  PyObject* name = PySequence_Check(names) && PySequence_Size(names) > 0
                       ? PySequence_GetItem(names, 0)
                       : nullptr;
  PyObject* inner = name != nullptr && PyUnicode_Check(name) ? PyObject_GetAttr(self, name)
                                                             : nullptr;
  Py_XDECREF(name);
  Py_DECREF(flattened);
  if (inner != nullptr && !THPVariable_Check(inner)) Py_CLEAR(inner);
  return inner;
}

}  // namespace

void torchrr_read_inner_tensor(const at::Tensor& wrapper, at::Tensor* out) {
  if (!PythonUsable()) return;
  GilAndErrorGuard guard;  // What the subclass raises is not the program's.
  // A Python subclass's tensor keeps its object (PyObject preservation): this is that object.
  PyObject* self = THPVariable_Wrap(wrapper);
  PyObject* inner = self != nullptr ? FirstFlattenedTensor(self) : nullptr;
  if (inner != nullptr) {
    const at::Tensor& tensor = THPVariable_Unpack(inner);
    if (tensor.unsafeGetTensorImpl() != wrapper.unsafeGetTensorImpl()) *out = tensor;
  }
  Py_XDECREF(inner);
  Py_XDECREF(self);
}
