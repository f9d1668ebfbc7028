// libtorchrr_python_nodes.so: what a Python torch.autograd.Function saved (ctx.save_for_backward),
// read from its THPFunction; what saved-tensor hooks packed; the inputs activation checkpointing
// keeps (checkpoint_inputs.h). Separate from the recorder because torch's python_function.h needs
// Python's symbols: this library is dlopen'ed only by a recorder running inside Python.
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

namespace compat = torchrr::recorder::compat;

extern "C" void torchrr_visit_py_node(torch::autograd::Node& node,
                                      const torchrr::recorder::SavedVariableVisitor& visit) {
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  auto* function = reinterpret_cast<THPFunction*>(compat::PythonObjectOf(py_node));
  if (function == nullptr) return;
  for (size_t i = 0; i < function->saved_variables.size(); ++i) {
    visit("saved_tensors", static_cast<uint32_t>(i), function->saved_variables[i]);
  }
}

namespace {

// PySavedVariableHooks keeps the unpack hook private, and SavedVariable its hooks: named here
// through explicit instantiation, which may name private members (as torch_internals.cc does), so
// a torch that renames them fails to compile.
template <typename Tag, auto Member>
struct MemberAccess {
  friend constexpr auto GetMember(Tag) { return Member; }
};
struct HooksTag { friend constexpr auto GetMember(HooksTag); };
struct UnpackHookTag { friend constexpr auto GetMember(UnpackHookTag); };
template struct MemberAccess<HooksTag, &torch::autograd::SavedVariable::hooks_>;
template struct MemberAccess<UnpackHookTag, &torch::autograd::PySavedVariableHooks::unpack_hook_>;

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
  torch::autograd::SavedVariableHooks* base = (saved.*GetMember(HooksTag{})).get();
  if (base == nullptr ||
      std::strcmp(typeid(*base).name(), "N5torch8autograd20PySavedVariableHooksE") != 0) {
    return;
  }
  auto* hooks = static_cast<torch::autograd::PySavedVariableHooks*>(base);
  auto& slot = hooks->*GetMember(UnpackHookTag{});
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
    auto followed = g_frames.find(frame);
    if (followed != g_frames.end()) {
      out.recompute_from = followed->second.inputs;
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

namespace {

// A Python autograd.Function's node is made inside its apply(), which is an op (a RecordFunction
// named after the class, numbered with the node's sequence number) that shows no outputs: the
// recorder would first see the node when another op took one of its outputs, maybe after a write
// that bypasses version counters. BackwardCFunction.__init__ (the ctx's class; the ctx is made
// inside apply, before forward) is wrapped: while the recorder follows, each new ctx is kept on a
// thread-local stack, and the apply's end takes its node (torchrr_take_function_node). What
// __init__ does is unchanged.

std::atomic<bool> g_follow_functions{false};
PyObject* g_ctx_init = nullptr;  // BackwardCFunction's __init__ before the wrap; set once.
// New references to the ctxs made on this thread whose apply has not ended, innermost last.
// Bounded: a ctx made outside a recorded apply is dropped in time.
thread_local std::vector<PyObject*> t_function_ctxs;
constexpr size_t kMaxFunctionCtxs = 64;

PyObject* CallCtxInit(PyObject* /*self*/, PyObject* args, PyObject* kwargs) {
  if (g_follow_functions.load(std::memory_order_acquire) && PyTuple_GET_SIZE(args) >= 1) {
    if (t_function_ctxs.size() >= kMaxFunctionCtxs) {
      Py_DECREF(t_function_ctxs.front());
      t_function_ctxs.erase(t_function_ctxs.begin());
    }
    PyObject* ctx = PyTuple_GET_ITEM(args, 0);
    Py_INCREF(ctx);
    t_function_ctxs.push_back(ctx);
  }
  return PyObject_Call(g_ctx_init, args, kwargs);
}

PyMethodDef kCtxInitDef = {"__init__", reinterpret_cast<PyCFunction>(CallCtxInit),
                           METH_VARARGS | METH_KEYWORDS,
                           "torch.autograd.function.BackwardCFunction.__init__, noted by torchrr."};

// Wraps BackwardCFunction.__init__ (what it resolves to: object's, or one a base defines). Holds
// the GIL.
void WrapCtxInit() {
  PyObject* name = PyUnicode_FromString("torch.autograd.function");
  PyObject* module = name != nullptr ? PyImport_GetModule(name) : nullptr;
  Py_XDECREF(name);
  PyObject* ctx_class = module != nullptr ? PyObject_GetAttrString(module, "BackwardCFunction")
                                          : nullptr;
  PyObject* original = ctx_class != nullptr ? PyObject_GetAttrString(ctx_class, "__init__")
                                            : nullptr;
  PyObject* function = original != nullptr ? PyCFunction_New(&kCtxInitDef, nullptr) : nullptr;
  PyObject* method = function != nullptr ? PyInstanceMethod_New(function) : nullptr;
  if (method != nullptr && PyObject_SetAttrString(ctx_class, "__init__", method) == 0) {
    g_ctx_init = original;  // Kept.
    original = nullptr;
  }
  PyErr_Clear();
  Py_XDECREF(method);
  Py_XDECREF(function);
  Py_XDECREF(original);
  Py_XDECREF(ctx_class);
  Py_XDECREF(module);
}

}  // namespace

// The tensors AOTAutograd keeps on a compiled region's ctx without a version check
// (`ctx._tensors_no_vc_check`, a list: what a user Function inside the region stashed on its
// ctx), read under the GIL. Python's error state is left as it was.
extern "C" void torchrr_read_unchecked_tensors(torch::autograd::Node& node,
                                               std::vector<at::Tensor>* out) {
  if (!PythonUsable()) return;
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* error_type = nullptr;
  PyObject* error_value = nullptr;
  PyObject* error_trace = nullptr;
  PyErr_Fetch(&error_type, &error_value, &error_trace);
  // Interned once, under the GIL; never released.
  static PyObject* const kName = PyUnicode_InternFromString("_tensors_no_vc_check");
  PyObject* ctx = compat::PythonObjectOf(py_node);
  // An attribute AOTAutograd sets on the ctx (an instance attribute: the generic lookup finds it
  // in the instance's dict, however the Python version lays that out).
  PyObject* list =
      ctx != nullptr && kName != nullptr ? PyObject_GenericGetAttr(ctx, kName) : nullptr;
  if (list != nullptr && PyList_Check(list)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
      PyObject* item = PyList_GET_ITEM(list, i);
      out->push_back(THPVariable_Check(item) ? THPVariable_Unpack(item) : at::Tensor());
    }
  }
  Py_XDECREF(list);
  PyErr_Clear();  // AttributeError: a ctx without the list (any Function's but AOTAutograd's).
  PyErr_Restore(error_type, error_value, error_trace);
  PyGILState_Release(gil);
}

namespace {

// What torch.compile's backward graph says of the tensors its forward saved: AOTAutograd keeps
// the graph it traced for backward (the CompiledFunction's `_lazy_backward_info.bw_module`, a
// torch.fx GraphModule, until its meta is stripped when the compiled result is cached), whose
// first placeholders are the saved tensors in ctx order (`saved_tensors`, then
// `_tensors_no_vc_check`; symbolic ints and opaque objects are no tensors) and whose nodes keep
// the traceback of the forward op they differentiate (`meta["stack_trace"]`). Per saved tensor:
// the traceback of the first node reading it, "" when none has one. Reads attributes and dicts
// only: no tensor op runs.
constexpr const char kSavedUsesSource[] = R"py(
def saved_uses(ctx_class):
    import torch
    forward_class = getattr(ctx_class, "_forward_cls", None)
    info = getattr(forward_class, "_lazy_backward_info", None)
    graph = getattr(getattr(info, "bw_module", None), "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return []
    uses = []
    for node in graph.nodes:
        if node.op != "placeholder" or node.name.startswith("tangents"):
            break
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        trace = ""
        for user in node.users:
            trace = user.meta.get("stack_trace") or ""
            if trace:
                break
        uses.append(trace if isinstance(trace, str) else "")
    return uses if any(uses) else []
)py";

PyObject* g_saved_uses_fn = nullptr;  // Compiled once, under the GIL; never released.

// What was read of a ctx class, kept while the class lives (a weak reference: a compiled region's
// class holds its compiled code, which the recorder must not keep alive): read once per class,
// the first time one of its applies ends recorded, as the meta is gone once the backward ran and
// was cached. `id` names the reading for the process (never reused; 0: nothing read).
struct SavedUsesEntry {
  PyObject* weakref = nullptr;  // Strong reference to the weak reference.
  uint64_t id = 0;
  std::vector<std::string> traces;
};
// By the class's address. Guarded by the GIL; bounded.
std::unordered_map<PyObject*, SavedUsesEntry>* g_saved_uses = nullptr;
uint64_t g_last_saved_uses_id = 0;  // Guarded by the GIL.
constexpr size_t kMaxSavedUseClasses = 4096;

// The weak reference's callback: the class is gone, and its address may be reused. Holds the GIL.
PyObject* ForgetSavedUses(PyObject* /*self*/, PyObject* weakref) {
  if (g_saved_uses != nullptr) {
    for (auto it = g_saved_uses->begin(); it != g_saved_uses->end(); ++it) {
      if (it->second.weakref == weakref) {
        Py_DECREF(it->second.weakref);
        g_saved_uses->erase(it);
        break;
      }
    }
  }
  Py_RETURN_NONE;
}

PyMethodDef kForgetSavedUsesDef = {"torchrr_forget_saved_uses", ForgetSavedUses, METH_O,
                                   "A compiled region's class is gone: torchrr forgets it."};

// The uses of `ctx_class`'s saved tensors, read now. Holds the GIL.
std::vector<std::string> ReadSavedUsesOf(PyObject* ctx_class) {
  std::vector<std::string> uses;
  if (g_saved_uses_fn == nullptr) {
    PyObject* globals = PyDict_New();
    if (globals != nullptr &&
        PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) == 0) {
      PyObject* done = PyRun_String(kSavedUsesSource, Py_file_input, globals, globals);
      Py_XDECREF(done);
      PyObject* fn = done != nullptr ? PyDict_GetItemString(globals, "saved_uses") : nullptr;
      Py_XINCREF(fn);
      g_saved_uses_fn = fn;
    }
    Py_XDECREF(globals);
    PyErr_Clear();
    if (g_saved_uses_fn == nullptr) return uses;
  }
  PyObject* list = PyObject_CallOneArg(g_saved_uses_fn, ctx_class);
  if (list != nullptr && PyList_Check(list)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
      const char* text = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
      uses.emplace_back(text != nullptr ? text : "");
    }
  }
  Py_XDECREF(list);
  PyErr_Clear();
  return uses;
}

// The entry of `ctx_class`, read when first seen; null when it cannot be kept. Holds the GIL.
const SavedUsesEntry* SavedUsesOf(PyObject* ctx_class) {
  if (g_saved_uses == nullptr) g_saved_uses = new std::unordered_map<PyObject*, SavedUsesEntry>();
  auto it = g_saved_uses->find(ctx_class);
  if (it != g_saved_uses->end()) return &it->second;
  if (g_saved_uses->size() >= kMaxSavedUseClasses) return nullptr;
  static PyObject* const forget = PyCFunction_New(&kForgetSavedUsesDef, nullptr);
  PyObject* weakref = forget != nullptr ? PyWeakref_NewRef(ctx_class, forget) : nullptr;
  if (weakref == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  SavedUsesEntry entry;
  entry.weakref = weakref;
  entry.traces = ReadSavedUsesOf(ctx_class);
  if (!entry.traces.empty()) entry.id = ++g_last_saved_uses_id;
  return &g_saved_uses->emplace(ctx_class, std::move(entry)).first->second;
}

}  // namespace

// Where backward uses each tensor a torch.compile region's node saved (kSavedUsesSource): the id
// of what was read of the node's class (the same for every node of that class while it lives; 0
// for any other node), and, when `traces` is given, the tracebacks themselves. Takes the GIL;
// Python's error state is left as it was.
extern "C" uint64_t torchrr_read_saved_uses(torch::autograd::Node& node,
                                            std::vector<std::string>* traces) {
  if (!PythonUsable()) return 0;
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  uint64_t id = 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* ctx = compat::PythonObjectOf(py_node);
  if (ctx != nullptr) {
    PyObject* error_type = nullptr;
    PyObject* error_value = nullptr;
    PyObject* error_trace = nullptr;
    PyErr_Fetch(&error_type, &error_value, &error_trace);
    const SavedUsesEntry* entry = SavedUsesOf(reinterpret_cast<PyObject*>(Py_TYPE(ctx)));
    if (entry != nullptr) {
      id = entry->id;
      if (traces != nullptr && id != 0) *traces = entry->traces;
    }
    PyErr_Restore(error_type, error_value, error_trace);
  }
  PyGILState_Release(gil);
  return id;
}

namespace {

// Starts following, wrapping what `wrap` wraps the first time (under the GIL), or stops (taking
// neither the GIL nor a lock). `following` says whether the wrap is in place and followed.
void SetFollowing(int follow, std::atomic<bool>& following, PyObject* const& wrapped,
                  void (*wrap)()) {
  if (follow == 0) {
    following.store(false, std::memory_order_release);
    return;
  }
  if (!PythonUsable()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* error_type = nullptr;
  PyObject* error_value = nullptr;
  PyObject* error_trace = nullptr;
  PyErr_Fetch(&error_type, &error_value, &error_trace);
  if (wrapped == nullptr) wrap();
  following.store(wrapped != nullptr, std::memory_order_release);
  PyErr_Restore(error_type, error_value, error_trace);
  PyGILState_Release(gil);
}

}  // namespace

// Starts or stops noting the ctxs Python Functions make (BackwardCFunction.__init__ is wrapped
// the first time); the ctxs noted stay until taken, or dropped when the stack is full.
extern "C" void torchrr_follow_function_nodes(int follow) {
  SetFollowing(follow, g_follow_functions, g_ctx_init, WrapCtxInit);
}

// Whether this thread has a ctx noted and not taken. Takes neither the GIL nor a lock.
extern "C" int torchrr_function_ctx_pending() { return t_function_ctxs.empty() ? 0 : 1; }

// At the end of an op numbered `sequence_nr` (a Function's apply shows its node's number): that
// node, when the innermost ctx noted on this thread is its; ctxs made inside it whose applies
// did not end recorded are dropped on the way. Takes the GIL.
extern "C" void torchrr_take_function_node(int64_t sequence_nr, compat::NodePtr* out) {
  if (t_function_ctxs.empty() || sequence_nr < 0 || !PythonUsable()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  while (!t_function_ctxs.empty()) {
    PyObject* ctx = t_function_ctxs.back();
    compat::NodePtr node = compat::NodeOfFunction(*reinterpret_cast<THPFunction*>(ctx));
    const int64_t n = node ? static_cast<int64_t>(node->sequence_nr()) : INT64_MAX;
    if (n < sequence_nr) break;  // An enclosing apply's, still running.
    t_function_ctxs.pop_back();
    Py_DECREF(ctx);
    if (n == sequence_nr) {
      *out = std::move(node);
      break;
    }
  }
  PyGILState_Release(gil);
}

// Starts or stops recording _CheckpointFrame.save_inputs calls (FollowCheckpointInputs); starting
// wraps it the first time.
extern "C" void torchrr_follow_checkpoint_inputs(int follow) {
  SetFollowing(follow, g_follow, g_save_inputs, WrapSaveInputs);
}

// What the node's wrapped unpack hooks returned on this thread that differs from what it saved
// (TakeUnpackedTensors). Takes neither the GIL nor a lock: thread-local.
extern "C" void torchrr_take_unpacked(const void* node,
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
