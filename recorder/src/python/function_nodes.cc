// Python torch.autograd.Function nodes: what ctx.save_for_backward kept, what else the ctx holds
// for backward (AOTAutograd's unchecked list, the tensors a forward stashed in its attributes),
// and each apply's node, noted as its ctx is made.
#include <ATen/EmptyTensor.h>
#include <ATen/record_function.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_saved_variable_hooks.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
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

void torchrr_visit_py_node(torch::autograd::Node& node,
                                      const torchrr::recorder::SavedVariableVisitor& visit) {
  auto& py_node = static_cast<torch::autograd::PyNode&>(node);
  auto* function = reinterpret_cast<THPFunction*>(compat::PythonObjectOf(py_node));
  if (function == nullptr) return;
  for (size_t i = 0; i < function->saved_variables.size(); ++i) {
    visit("saved_tensors", static_cast<uint32_t>(i), function->saved_variables[i]);
  }
}

namespace {

using torchrr::recorder::UncheckedTensor;

// At most this many tensors are read from one ctx: its attributes are the Function's to fill, and
// the walk runs under the GIL at the end of every apply.
constexpr size_t kMaxStashed = 64;

// The ctx's attributes, the tensors it reaches (StashWalk::Walk), each tensor once.
struct StashWalk {
  std::vector<UncheckedTensor>* out;
  std::vector<const void*> seen;  // TensorImpls already taken.

  void Take(PyObject* value, const std::string& name, uint32_t index) {
    if (out->size() >= kMaxStashed) return;
    const at::Tensor& t = THPVariable_Unpack(value);
    const void* impl = t.unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) return;
    seen.push_back(impl);
    out->push_back({t, name, index});
  }
  // `value` if it is a tensor; the tensors of a tuple, list or dict it is; and, `depth` levels
  // down, the attributes of a plain object (an instance that is no type, module or callable: a
  // quantization state, not an nn.Module).
  void Walk(PyObject* value, const std::string& name, int depth) {
    if (THPVariable_Check(value)) {
      Take(value, name, torchrr::format::TensorUse::kNotInList);
    } else if (PyTuple_Check(value) || PyList_Check(value)) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
      PyObject** items = PySequence_Fast_ITEMS(value);
      for (Py_ssize_t i = 0; i < n && i < 1024; ++i) {
        if (THPVariable_Check(items[i])) Take(items[i], name, static_cast<uint32_t>(i));
      }
    } else if (PyDict_Check(value)) {
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      Py_ssize_t pos = 0;
      while (PyDict_Next(value, &pos, &key, &item)) {
        if (!THPVariable_Check(item)) continue;
        const char* text = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
        if (text == nullptr) {
          PyErr_Clear();
          continue;
        }
        Take(item, name + "['" + text + "']", torchrr::format::TensorUse::kNotInList);
      }
    } else if (depth > 0 && !PyType_Check(value) && !PyModule_Check(value) &&
               !PyCallable_Check(value)) {
      PyObject* dict = PyObject_GenericGetDict(value, nullptr);
      if (dict == nullptr) {
        PyErr_Clear();
        return;
      }
      if (PyDict_Check(dict)) Attributes(dict, name, depth - 1);
      Py_DECREF(dict);
    }
  }
  void Attributes(PyObject* dict, const std::string& prefix, int depth) {
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dict, &pos, &key, &value) && out->size() < kMaxStashed) {
      const char* text = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
      if (text == nullptr) {
        PyErr_Clear();
        continue;
      }
      if (std::strcmp(text, "_tensors_no_vc_check") == 0) continue;  // Read as a list, first.
      Walk(value, prefix + "." + text, depth);
    }
  }
};

}  // namespace

void torchrr_read_unchecked_tensors(torch::autograd::Node& node,
                                    std::vector<UncheckedTensor>* out) {
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
      out->push_back({THPVariable_Check(item) ? THPVariable_Unpack(item) : at::Tensor(),
                      "_tensors_no_vc_check", static_cast<uint32_t>(i)});
    }
  }
  Py_XDECREF(list);
  PyErr_Clear();  // AttributeError: a ctx without the list (any Function's but AOTAutograd's).
  // What the Function's forward left in the ctx's attributes. Not torch.compile's regions
  // (CompiledFunctionBackward): what they keep for backward is saved or in the list above.
  static constexpr std::string_view kCompiled = "CompiledFunction";
  if (ctx != nullptr && std::strncmp(Py_TYPE(ctx)->tp_name, kCompiled.data(), kCompiled.size()) != 0) {
    PyObject* dict = PyObject_GenericGetDict(ctx, nullptr);
    if (dict != nullptr && PyDict_Check(dict)) {
      StashWalk walk{out, {}};
      walk.Attributes(dict, "ctx", 1);
    }
    Py_XDECREF(dict);
    PyErr_Clear();
  }
  PyErr_Restore(error_type, error_value, error_trace);
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

void torchrr_follow_function_nodes(int follow) {
  SetFollowing(follow, g_follow_functions, g_ctx_init, WrapCtxInit);
}

int torchrr_function_ctx_pending() { return t_function_ctxs.empty() ? 0 : 1; }

void torchrr_take_function_node(int64_t sequence_nr, compat::NodePtr* out) {
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
