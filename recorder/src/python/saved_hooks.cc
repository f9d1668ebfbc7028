// What saved-tensor hooks packed (torch.autograd.graph.saved_tensors_hooks, save_on_cpu,
// checkpointing's placeholders), and a watch on what a packed tensor's unpack hook returns.
#include <ATen/EmptyTensor.h>
#include <ATen/record_function.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_saved_variable_hooks.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "capture/checkpoint_inputs.h"
#include "capture/saved_variables.h"
#include "internals/private_access.h"
#include "internals/torch_compat.h"
#include "python/checkpoint_frames.h"
#include "python/python_nodes.h"
#include "python/python_util.h"

namespace compat = torchrr::recorder::compat;
using torchrr::recorder::python::PythonUsable;

// PySavedVariableHooks keeps the unpack hook private, and SavedVariable its hooks
// (private_access.h: tags and instantiations in MemberAccess's namespace).
namespace torchrr::recorder {
struct SavedVariableHooksTag { friend constexpr auto GetMember(SavedVariableHooksTag); };
struct PyUnpackHookTag { friend constexpr auto GetMember(PyUnpackHookTag); };
template struct MemberAccess<SavedVariableHooksTag, &torch::autograd::SavedVariable::hooks_>;
template struct MemberAccess<PyUnpackHookTag,
                             &torch::autograd::PySavedVariableHooks::unpack_hook_>;
}  // namespace torchrr::recorder

namespace {

using torchrr::recorder::PyUnpackHookTag;
using torchrr::recorder::SavedVariableHooksTag;

// What a wrapped unpack hook returned that differs from what was saved, per thread, with the
// node it was saved by, until that node's backward function ends (torchrr_take_unpacked).
// Bounded: unpacks outside backward (grad_fn._saved_result) are never taken.
constexpr size_t kMaxUnpacked = 64;
thread_local std::vector<std::pair<const void*, torchrr::format::UnpackedTensor>> t_unpacked;

// A user's unpack hook wrapped to compare what it returns with what the node saved: the hook, and
// the expectation. Owned by the wrapper's capsule.
struct UnpackWatch {
  PyObject* hook = nullptr;  // Strong reference.
  torchrr::recorder::UnpackExpectation expect;
};
constexpr const char* kWatchCapsule = "torchrr.UnpackWatch";

void DropWatch(PyObject* capsule) {
  auto* watch = static_cast<UnpackWatch*>(PyCapsule_GetPointer(capsule, kWatchCapsule));
  if (watch == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(watch->hook);
  delete watch;
}

// The wrapper: calls the hook and hands back what it returns, unchanged; notes a tensor whose
// dtype or shape is not the saved one's.
PyObject* CallWatchedUnpack(PyObject* capsule, PyObject* packed) {
  auto* watch = static_cast<UnpackWatch*>(PyCapsule_GetPointer(capsule, kWatchCapsule));
  if (watch == nullptr) return nullptr;
  PyObject* result = PyObject_CallOneArg(watch->hook, packed);
  if (result == nullptr || !THPVariable_Check(result)) return result;
  const at::Tensor& tensor = THPVariable_Unpack(result);
  const torchrr::recorder::UnpackExpectation& expect = watch->expect;
  if (!tensor.defined() || tensor.is_nested() ||
      tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return result;
  }
  const auto dtype = static_cast<torchrr::format::DType>(tensor.scalar_type());
  if (dtype == expect.dtype && tensor.sizes().equals(expect.shape)) return result;
  if (t_unpacked.size() >= kMaxUnpacked) t_unpacked.erase(t_unpacked.begin());
  torchrr::format::UnpackedTensor unpacked;
  unpacked.saved = expect.saved_index;
  unpacked.dtype = dtype;
  unpacked.shape = tensor.sizes().vec();
  unpacked.saved_dtype = expect.dtype;
  unpacked.saved_shape = expect.shape;
  t_unpacked.emplace_back(expect.node, std::move(unpacked));
  return result;
}

PyMethodDef kWatchDef = {"torchrr_watched_unpack_hook", CallWatchedUnpack, METH_O,
                         "A saved_tensors_hooks unpack hook, watched by torchrr."};

// The user's hook when `hook` is torchrr's wrapper (a node read again), else `hook`. Borrowed.
PyObject* Unwatched(PyObject* hook) {
  if (hook == nullptr || !PyCFunction_Check(hook) ||
      PyCFunction_GET_FUNCTION(hook) != reinterpret_cast<PyCFunction>(CallWatchedUnpack)) {
    return hook;
  }
  auto* watch =
      static_cast<UnpackWatch*>(PyCapsule_GetPointer(PyCFunction_GET_SELF(hook), kWatchCapsule));
  if (watch == nullptr) {
    PyErr_Clear();
    return hook;
  }
  return watch->hook;
}

// Replaces the unpack hook of `saved` (Python hooks that packed a tensor) with the wrapper.
void WatchUnpack(const torch::autograd::SavedVariable& saved,
                 const torchrr::recorder::UnpackExpectation& expect) {
  // By the mangled type name, as IsPythonNode does: libtorch_python does not export the type
  // information a dynamic_cast needs.
  torch::autograd::SavedVariableHooks* base = (saved.*GetMember(SavedVariableHooksTag{})).get();
  if (base == nullptr ||
      std::strcmp(typeid(*base).name(), "N5torch8autograd20PySavedVariableHooksE") != 0) {
    return;
  }
  auto* hooks = static_cast<torch::autograd::PySavedVariableHooks*>(base);
  auto& slot = hooks->*GetMember(PyUnpackHookTag{});
  c10::impl::PyInterpreter* interpreter = getPyInterpreter();
  PyObject* hook = compat::SlotObject(slot, interpreter);
  if (hook == nullptr || Unwatched(hook) != hook) return;  // Already watched.
  Py_INCREF(hook);  // The watch's.
  auto* watch = new UnpackWatch{hook, expect};
  PyObject* capsule = PyCapsule_New(watch, kWatchCapsule, DropWatch);
  if (capsule == nullptr) {
    Py_DECREF(hook);
    delete watch;
    PyErr_Clear();
    return;
  }
  PyObject* wrapper = PyCFunction_New(&kWatchDef, capsule);
  Py_DECREF(capsule);  // The wrapper holds it (or, on failure, DropWatch ran).
  if (wrapper == nullptr) {
    PyErr_Clear();
    return;
  }
  // PySavedVariableHooks' reference, which its destructor drops; its reference to the hook is
  // dropped (the watch holds one).
  compat::SetSlotObject(slot, wrapper, interpreter, Py_DecRef);
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

// The code object of the Python function `hook` runs: a function's, a bound method's function's,
// a functools.partial's func's. Borrowed reference, or nullptr (a builtin, a callable object).
PyObject* HookCode(PyObject* hook, int depth) {
  if (hook == nullptr || depth > 3) return nullptr;
  if (PyFunction_Check(hook)) return PyFunction_GetCode(hook);
  if (PyMethod_Check(hook)) return HookCode(PyMethod_GET_FUNCTION(hook), depth + 1);
  if (std::strcmp(Py_TYPE(hook)->tp_name, "functools.partial") == 0) {
    PyObject* func = PyObject_GetAttrString(hook, "func");
    if (func == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    PyObject* code = HookCode(func, depth + 1);  // Borrowed from func, which the partial keeps.
    Py_DECREF(func);
    return code;
  }
  return nullptr;
}

// Where the unpack hook was defined: its code object (a new reference, for ReadSavedHook) and
// first line.
void ReadHookCode(PyObject* unpack_hook, torchrr::recorder::SavedHookFacts& out) {
  PyObject* code = HookCode(unpack_hook, 0);
  if (code == nullptr) return;
  PyObject* line = PyObject_GetAttrString(code, "co_firstlineno");
  if (line == nullptr) {
    PyErr_Clear();
    return;
  }
  const long first_line = PyLong_AsLong(line);
  Py_DECREF(line);
  if (first_line < 0) {
    PyErr_Clear();
    return;
  }
  Py_INCREF(code);
  out.hook_code = code;
  out.hook_line = static_cast<int32_t>(first_line);
}

void ReadHookData(PyObject* unpack_hook, PyObject* data, torchrr::recorder::SavedHookFacts& out) {
  if (PyObject* tensor = data != nullptr ? PackedTensorObject(data) : nullptr) {
    out.kind = torchrr::format::SavedHook::kPackedTensor;
    out.packed = THPVariable_Unpack(tensor);
    ReadHookCode(Unwatched(unpack_hook), out);
    return;
  }
  PyObject* frame = CheckpointFrameOf(unpack_hook, 0);
  if (frame == nullptr) {
    ReadHookCode(unpack_hook, out);  // kOpaque: the user's hook, packing something else.
    return;
  }
  PyObject* saver = PyObject_GetAttrString(frame, "input_saver");
  if (saver == nullptr) {  // 2.12 on: the frame holds the inputs itself.
    PyErr_Clear();
    if (compat::NodePtr inputs = torchrr::recorder::python::FollowedCheckpointInputs(frame)) {
      out.recompute_from = std::move(inputs);
      out.kind = torchrr::format::SavedHook::kCheckpoint;
    }
    return;
  }
  if (THPVariable_Check(saver)) {
    out.recompute_from = THPVariable_Unpack(saver).grad_fn();
    if (out.recompute_from) out.kind = torchrr::format::SavedHook::kCheckpoint;
  }
  Py_DECREF(saver);
}

}  // namespace

void torchrr_read_saved_hook(const torch::autograd::SavedVariable& saved,
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
      // Only a packed tensor's: checkpointing's placeholder is unpacked by recomputation, which
      // does its own checks.
      if (out->kind == torchrr::format::SavedHook::kPackedTensor && out->expect) {
        WatchUnpack(saved, *out->expect);
      }
    } catch (const std::exception&) {
      // Hooks that are not Python's (a C++ program's own SavedVariableHooks): opaque.
    }
    PyErr_Restore(error_type, error_value, error_trace);
  }
  PyGILState_Release(gil);
}

void torchrr_take_unpacked(const void* node,
                                      std::vector<torchrr::format::UnpackedTensor>* out) {
  if (t_unpacked.empty()) return;
  auto kept = t_unpacked.begin();
  for (auto& entry : t_unpacked) {
    if (entry.first == node) {
      out->push_back(std::move(entry.second));
    } else {
      if (&*kept != &entry) *kept = std::move(entry);
      ++kept;
    }
  }
  t_unpacked.erase(kept, t_unpacked.end());
}
