// The CPython functions the stack capture calls, without Python's headers: each is declared here
// with an opaque PyObject and resolved with dlsym(RTLD_DEFAULT) the first time a stack is
// captured, so the recorder loads into C++ programs as into Python ones. The functions used are
// all in the stable ABI of CPython 3.9+ (PyFrame_GetCode, PyFrame_GetBack,
// PyThreadState_GetFrame), except PyUnicode_AsUTF8 (exported by every CPython 3 build) and the
// finalization check, which is optional (_Py_IsFinalizing until 3.12, Py_IsFinalizing from 3.13).
// PyUnicode_EncodeFSDefault and PyBytes_AsStringAndSize, for paths that are not UTF-8, are
// optional too.
#ifndef TORCHRR_RECORDER_CPYTHON_API_H_
#define TORCHRR_RECORDER_CPYTHON_API_H_

#include <sys/types.h>

namespace torchrr::recorder::cpython {

struct PyObject;  // Opaque: only pointers pass through this file.
using PyFrameObject = PyObject;
using PyCodeObject = PyObject;
using PyThreadState = void;
using PyGILStateState = int;  // PyGILState_STATE is an enum: an int in the C ABI.

struct CPython {
  int (*Py_IsInitialized)() = nullptr;
  int (*IsFinalizing)() = nullptr;  // Optional.
  PyThreadState* (*PyGILState_GetThisThreadState)() = nullptr;
  PyGILStateState (*PyGILState_Ensure)() = nullptr;
  void (*PyGILState_Release)(PyGILStateState) = nullptr;
  PyFrameObject* (*PyThreadState_GetFrame)(PyThreadState*) = nullptr;  // New reference.
  PyFrameObject* (*PyFrame_GetBack)(PyFrameObject*) = nullptr;         // New reference.
  PyCodeObject* (*PyFrame_GetCode)(PyFrameObject*) = nullptr;          // New reference.
  int (*PyFrame_GetLineNumber)(PyFrameObject*) = nullptr;
  // Optional (3.11+ and 3.10+): with both, lines are looked up once per (code, instruction).
  int (*PyFrame_GetLasti)(PyFrameObject*) = nullptr;
  int (*PyCode_Addr2Line)(PyCodeObject*, int) = nullptr;
  void (*Py_IncRef)(PyObject*) = nullptr;
  void (*Py_DecRef)(PyObject*) = nullptr;
  PyObject* (*PyObject_GetAttrString)(PyObject*, const char*) = nullptr;  // New reference.
  const char* (*PyUnicode_AsUTF8)(PyObject*) = nullptr;
  // Optional: a path whose bytes are not UTF-8 (a str with surrogate escapes) as those bytes.
  PyObject* (*PyUnicode_EncodeFSDefault)(PyObject*) = nullptr;  // New reference.
  int (*PyBytes_AsStringAndSize)(PyObject*, char**, ssize_t*) = nullptr;
  void (*PyErr_Clear)() = nullptr;
  const unsigned long* Py_Version = nullptr;  // Optional (3.11+): PY_VERSION_HEX of the runtime.
  PyObject* (*PySys_GetObject)(const char*) = nullptr;  // Borrowed reference.
  PyObject* (*PyImport_GetModuleDict)() = nullptr;      // Borrowed reference.
  PyObject* (*PyDict_GetItemString)(PyObject*, const char*) = nullptr;  // Borrowed reference.
  bool usable = false;  // Every required function was found.
};

// The functions, resolved once; `usable` false (after one warning when the interpreter is too
// old) when a required one is missing, as in a C++ program.
const CPython& Api();

}  // namespace torchrr::recorder::cpython

#endif  // TORCHRR_RECORDER_CPYTHON_API_H_
