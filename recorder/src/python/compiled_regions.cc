// torch.compile regions' nodes: the tensors AOTAutograd keeps without a version check, and where
// backward uses each tensor the region saved (torchrr/_saved_uses.py, embedded at build).
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
#include "saved_uses_source.h"  // kSavedUsesSource, generated from torchrr/_saved_uses.py.

namespace {

// saved_uses(ctx_class) of torchrr/_saved_uses.py, which says what torch.compile's backward graph
// says of the tensors its forward saved.
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

uint64_t torchrr_read_saved_uses(torch::autograd::Node& node,
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
