// Non-reentrant checkpointing's inputs from torch 2.12 on: _CheckpointFrame.save_inputs wrapped,
// each frame followed with its CheckpointInputs.
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
#include "internals/torch_compat.h"
#include "python/python_nodes.h"
#include "python/python_util.h"

namespace compat = torchrr::recorder::compat;
using torchrr::recorder::python::PythonUsable;
using torchrr::recorder::python::SetFollowing;
#include "python/checkpoint_frames.h"

namespace {

// Non-reentrant checkpointing from torch 2.12 on keeps a checkpointed call's inputs in its frame
// (checkpoint_inputs.h). _CheckpointFrame.save_inputs, which makes them, is wrapped: while the
// recorder follows (g_follow), each call runs inside a RecordFunction named
// CheckpointInputs::kSaveOpName, with the call's tensors as inputs (the op a report names as the
// victim: its stack is the checkpointed call's), and returns, as that op's output, an empty tensor
// whose grad_fn is the frame's CheckpointInputs, as _NoopSaveInputs did up to 2.11: the recorder
// writes the node, and its creator, at the op's end. What save_inputs does and returns is
// unchanged; autograd's sequence numbers do not move.

// Set and cleared without the GIL (torchrr_follow_checkpoint_inputs).
std::atomic<bool> g_follow{false};
// Strong references, set once (the first follow) under the GIL: torch's save_inputs, and the
// SavedTensor type its frames hold.
PyObject* g_save_inputs = nullptr;
PyObject* g_saved_tensor_type = nullptr;

// The frames recorded, by address: each one's CheckpointInputs, and the weak reference (strong
// here) whose callback forgets the frame as it goes. Guarded by the GIL. Never destroyed: a frame
// can go while the interpreter shuts down, after static destructors.
struct FollowedFrame {
  PyObject* weakref = nullptr;
  compat::NodePtr inputs;
};
std::unordered_map<PyObject*, FollowedFrame>& g_frames =
    *new std::unordered_map<PyObject*, FollowedFrame>();

void WarnNotFollowed(const char* why) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::fprintf(stderr,
               "torchrr: warning: activation checkpointing's inputs are not followed (%s): a write "
               "to one is reported as an error torchrr does not explain\n",
               why);
}

// The weak reference's callback: the frame at the address `key` holds is going.
PyObject* ForgetFrame(PyObject* key, PyObject* /*weakref*/) {
  auto followed = g_frames.find(static_cast<PyObject*>(PyLong_AsVoidPtr(key)));
  if (followed == g_frames.end()) Py_RETURN_NONE;
  static_cast<torchrr::recorder::CheckpointInputs&>(*followed->second.inputs).Clear();
  PyObject* weakref = followed->second.weakref;
  g_frames.erase(followed);
  Py_XDECREF(weakref);  // The caller holds one too.
  Py_RETURN_NONE;
}

PyMethodDef kForgetFrameDef = {"torchrr_forget_checkpoint_frame", ForgetFrame, METH_O,
                               "Forgets a checkpoint frame that is going."};

// The SavedVariable a SavedTensor object (pybind11's binding of SavedVariable) holds, or nullptr.
const torch::autograd::SavedVariable* SavedVariableOf(PyObject* object) {
  try {
    return pybind11::cast<const torch::autograd::SavedVariable*>(pybind11::handle(object));
  } catch (const std::exception&) {  // pybind11::cast_error: another pybind11's type registry.
    PyErr_Clear();
    return nullptr;
  }
}

// Makes the CheckpointInputs of `frame`, whose save_inputs just returned, and follows the frame
// until it goes. nullptr, with one warning, when its saved_args cannot be read.
compat::NodePtr FollowFrame(PyObject* frame) {
  PyObject* args = PyObject_GetAttrString(frame, "saved_args");
  if (args == nullptr || !PyList_Check(args)) {
    PyErr_Clear();
    Py_XDECREF(args);
    WarnNotFollowed("the frame has no saved_args list");
    return {};
  }
  std::vector<torchrr::recorder::CheckpointInputs::Input> inputs;
  bool readable = true;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args) && readable; ++i) {
    PyObject* item = PyList_GET_ITEM(args, i);
    if (!PyObject_TypeCheck(item, reinterpret_cast<PyTypeObject*>(g_saved_tensor_type))) continue;
    const torch::autograd::SavedVariable* saved = SavedVariableOf(item);
    readable = saved != nullptr;
    inputs.emplace_back(static_cast<uint32_t>(i), saved);
  }
  Py_DECREF(args);
  if (!readable) {
    WarnNotFollowed("a SavedTensor's SavedVariable cannot be read");
    return {};
  }
  PyObject* key = PyLong_FromVoidPtr(frame);
  PyObject* forget = key != nullptr ? PyCFunction_New(&kForgetFrameDef, key) : nullptr;
  Py_XDECREF(key);  // The callback holds it.
  PyObject* weakref = forget != nullptr ? PyWeakref_NewRef(frame, forget) : nullptr;
  Py_XDECREF(forget);  // The weak reference holds it.
  if (weakref == nullptr) {
    PyErr_Clear();
    WarnNotFollowed("no weak reference to the checkpoint frame");
    return {};
  }
  compat::NodePtr node = compat::MakeNode<torchrr::recorder::CheckpointInputs>(std::move(inputs));
  FollowedFrame& followed = g_frames[frame];
  if (followed.inputs) {  // save_inputs again on the same frame: the new inputs replace the old.
    static_cast<torchrr::recorder::CheckpointInputs&>(*followed.inputs).Clear();
    Py_DECREF(followed.weakref);
  }
  followed = FollowedFrame{weakref, node};
  return node;
}

// _CheckpointFrame.save_inputs, wrapped: args are (frame, *inputs).
PyObject* CallSaveInputs(PyObject* /*self*/, PyObject* args) {
  if (!g_follow.load(std::memory_order_acquire) || PyTuple_GET_SIZE(args) < 1) {
    return PyObject_Call(g_save_inputs, args, nullptr);
  }
  // Before the RecordFunction, which keeps a reference to them until it ends.
  std::vector<c10::IValue> inputs;
  for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if (THPVariable_Check(item)) inputs.emplace_back(THPVariable_Unpack(item));
  }
  at::RecordFunction record(at::RecordScope::FUNCTION);
  if (record.isActive()) {
    record.before(torchrr::recorder::CheckpointInputs::kSaveOpName,
                  c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  }
  PyObject* result = PyObject_Call(g_save_inputs, args, nullptr);
  if (result == nullptr || !record.isActive()) return result;
  try {
    if (compat::NodePtr node = FollowFrame(PyTuple_GET_ITEM(args, 0))) {
      // Made below the dispatcher: no op of its own.
      at::Tensor marker = at::detail::empty_cpu({0}, at::kFloat, /*pin_memory=*/false,
                                                /*memory_format_opt=*/std::nullopt);
      torch::autograd::impl::set_gradient_edge(marker, torch::autograd::Edge(std::move(node), 0));
      record.setOutputs(std::vector<c10::IValue>{std::move(marker)});
    }
  } catch (const std::exception& e) {
    WarnNotFollowed(e.what());
  }
  return result;
}

PyMethodDef kSaveInputsDef = {"save_inputs", CallSaveInputs, METH_VARARGS,
                              "torch.utils.checkpoint's _CheckpointFrame.save_inputs, recorded by "
                              "torchrr."};

// Wraps _CheckpointFrame.save_inputs, where the frame has one (2.12 on); up to 2.11 the inputs'
// node is autograd's own (input_saver), and there is nothing to wrap. Holds the GIL.
void WrapSaveInputs() {
  PyObject* name = PyUnicode_FromString("torch.utils.checkpoint");
  PyObject* module = name != nullptr ? PyImport_GetModule(name) : nullptr;
  Py_XDECREF(name);
  if (module == nullptr) {  // Not imported (import torch imports it): nothing to follow.
    PyErr_Clear();
    return;
  }
  PyObject* frame_class = PyObject_GetAttrString(module, "_CheckpointFrame");
  PyObject* original =
      frame_class != nullptr ? PyObject_GetAttrString(frame_class, "save_inputs") : nullptr;
  PyObject* saved_tensor_type =
      original != nullptr ? PyObject_GetAttrString(module, "SavedTensor") : nullptr;
  PyErr_Clear();
  PyObject* method = nullptr;
  if (saved_tensor_type != nullptr && PyType_Check(saved_tensor_type)) {
    PyObject* function = PyCFunction_New(&kSaveInputsDef, nullptr);
    method = function != nullptr ? PyInstanceMethod_New(function) : nullptr;
    Py_XDECREF(function);
  }
  if (method != nullptr && PyObject_SetAttrString(frame_class, "save_inputs", method) == 0) {
    g_save_inputs = original;
    g_saved_tensor_type = saved_tensor_type;
    original = saved_tensor_type = nullptr;  // Kept.
  } else if (original != nullptr) {
    PyErr_Clear();
    WarnNotFollowed("_CheckpointFrame.save_inputs cannot be wrapped");
  }
  Py_XDECREF(method);
  Py_XDECREF(saved_tensor_type);
  Py_XDECREF(original);
  Py_XDECREF(frame_class);
  Py_DECREF(module);
}

}  // namespace

namespace torchrr::recorder::python {

compat::NodePtr FollowedCheckpointInputs(PyObject* frame) {
  auto followed = g_frames.find(frame);
  return followed != g_frames.end() ? followed->second.inputs : nullptr;
}

}  // namespace torchrr::recorder::python

void torchrr_follow_checkpoint_inputs(int follow) {
  SetFollowing(follow, g_follow, g_save_inputs, WrapSaveInputs);
}
