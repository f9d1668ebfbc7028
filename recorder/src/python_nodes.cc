// libtorchrr_python_nodes.so: what a Python torch.autograd.Function saved (ctx.save_for_backward),
// read from its THPFunction. Separate from the recorder because torch's python_function.h needs
// Python's symbols: this library is dlopen'ed only by a recorder running inside Python.
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

#include "saved_variables.h"

extern "C" void torchrr_visit_py_node(torch::autograd::Node& node,
                                      const torchrr::recorder::SavedVariableVisitor& visit) {
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  auto* function =
      reinterpret_cast<THPFunction*>(torchrr::recorder::compat::PythonObjectOf(py_node));
  if (function == nullptr) return;
  for (size_t i = 0; i < function->saved_variables.size(); ++i) {
    visit("saved_tensors", static_cast<uint32_t>(i), function->saved_variables[i]);
  }
}

namespace {

bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// The first tensor among `object` and, for a tuple or list, its items (save_on_cpu packs
// (device, tensor)).
PyObject* PackedTensorObject(PyObject* object) {
  if (THPVariable_Check(object)) return object;
  if (PyTuple_Check(object) || PyList_Check(object)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(object);
    PyObject** items = PySequence_Fast_ITEMS(object);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (THPVariable_Check(items[i])) return items[i];
    }
  }
  return nullptr;
}

// torch.utils.checkpoint's frame, when `hook` is (or wraps) the unpack hook of
// _checkpoint_hook: the frame is a free variable of the closure. Borrowed reference, or nullptr.
PyObject* CheckpointFrameOf(PyObject* hook, int depth) {
  if (hook == nullptr || !PyFunction_Check(hook) || depth > 2) return nullptr;
  PyObject* closure = PyFunction_GetClosure(hook);
  if (closure == nullptr || !PyTuple_Check(closure)) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(closure); ++i) {
    PyObject* cell = PyTuple_GET_ITEM(closure, i);
    if (!PyCell_Check(cell)) continue;
    PyObject* value = PyCell_GET(cell);
    if (value == nullptr) continue;
    if (std::strcmp(Py_TYPE(value)->tp_name, "_CheckpointFrame") == 0) return value;
    if (PyObject* frame = CheckpointFrameOf(value, depth + 1)) return frame;
  }
  return nullptr;
}

void ReadHookData(PyObject* unpack_hook, PyObject* data, torchrr::recorder::SavedHookFacts& out) {
  if (PyObject* tensor = data != nullptr ? PackedTensorObject(data) : nullptr) {
    out.kind = torchrr::format::SavedHook::kPackedTensor;
    out.packed = THPVariable_Unpack(tensor);
    return;
  }
  PyObject* frame = CheckpointFrameOf(unpack_hook, 0);
  if (frame == nullptr) return;
  PyObject* saver = PyObject_GetAttrString(frame, "input_saver");
  if (saver == nullptr) {
    PyErr_Clear();
    return;
  }
  if (THPVariable_Check(saver)) {
    out.recompute_from = THPVariable_Unpack(saver).grad_fn();
    if (out.recompute_from) out.kind = torchrr::format::SavedHook::kCheckpoint;
  }
  Py_DECREF(saver);
}

}  // namespace

// What the saved-tensor hooks of `saved` packed. Takes the GIL: the caller holds no lock that a
// thread holding the GIL could wait for.
extern "C" void torchrr_read_saved_hook(const torch::autograd::SavedVariable& saved,
                                        torchrr::recorder::SavedHookFacts* out) {
  if (!PythonUsable()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  {
    PyObject* error_type = nullptr;
    PyObject* error_value = nullptr;
    PyObject* error_trace = nullptr;
    PyErr_Fetch(&error_type, &error_value, &error_trace);  // A raising op's error stays as it was.
    try {
      auto data = saved.retrieve_unpack_hook_data();
      if (data) {
        const c10::impl::PyInterpreter* interpreter = getPyInterpreter();
        ReadHookData(data->first.ptr(interpreter), data->second.ptr(interpreter), *out);
      }
    } catch (const std::exception&) {
      // Hooks that are not Python's (a C++ program's own SavedVariableHooks): opaque.
    }
    PyErr_Restore(error_type, error_value, error_trace);
  }
  PyGILState_Release(gil);
}
