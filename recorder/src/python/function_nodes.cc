// Python torch.autograd.Function nodes: what ctx.save_for_backward kept, and each apply's node,
// noted as its ctx is made.
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
