#include "stacks/cpython_api.h"

#include <dlfcn.h>

#include <cstdio>

namespace torchrr::recorder::cpython {
namespace {

template <typename F>
bool Resolve(F*& f, const char* name) {
  f = reinterpret_cast<F*>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

}  // namespace

const CPython& Api() {
  static const CPython api = [] {
    CPython a;
    bool ok = Resolve(a.Py_IsInitialized, "Py_IsInitialized");
    // Without the interpreter's symbols (a C++ program) there is nothing more to look for.
    if (!ok) return a;
    if (!Resolve(a.IsFinalizing, "Py_IsFinalizing")) Resolve(a.IsFinalizing, "_Py_IsFinalizing");
    Resolve(a.Py_Version, "Py_Version");
    if (!Resolve(a.PyUnicode_EncodeFSDefault, "PyUnicode_EncodeFSDefault") ||
        !Resolve(a.PyBytes_AsStringAndSize, "PyBytes_AsStringAndSize")) {
      a.PyUnicode_EncodeFSDefault = nullptr;
      a.PyBytes_AsStringAndSize = nullptr;
    }
    if (!Resolve(a.PyFrame_GetLasti, "PyFrame_GetLasti") ||
        !Resolve(a.PyCode_Addr2Line, "PyCode_Addr2Line")) {
      a.PyFrame_GetLasti = nullptr;
      a.PyCode_Addr2Line = nullptr;
    }
    ok = Resolve(a.PyGILState_GetThisThreadState, "PyGILState_GetThisThreadState") &&
         Resolve(a.PyGILState_Ensure, "PyGILState_Ensure") &&
         Resolve(a.PyGILState_Release, "PyGILState_Release") &&
         Resolve(a.PyThreadState_GetFrame, "PyThreadState_GetFrame") &&
         Resolve(a.PyFrame_GetBack, "PyFrame_GetBack") &&
         Resolve(a.PyFrame_GetCode, "PyFrame_GetCode") &&
         Resolve(a.PyFrame_GetLineNumber, "PyFrame_GetLineNumber") &&
         Resolve(a.Py_IncRef, "Py_IncRef") && Resolve(a.Py_DecRef, "Py_DecRef") &&
         Resolve(a.PyObject_GetAttrString, "PyObject_GetAttrString") &&
         Resolve(a.PyUnicode_AsUTF8, "PyUnicode_AsUTF8") &&
         Resolve(a.PyErr_Clear, "PyErr_Clear") &&
         Resolve(a.PySys_GetObject, "PySys_GetObject") &&
         Resolve(a.PyImport_GetModuleDict, "PyImport_GetModuleDict") &&
         Resolve(a.PyDict_GetItemString, "PyDict_GetItemString");
    if (!ok) {
      // An interpreter older than 3.9, or one built without these: say so once, record no frames.
      std::fprintf(stderr, "torchrr: warning: this Python lacks PyFrame_GetCode and friends "
                           "(CPython 3.9+ needed): no Python stacks\n");
      return a;
    }
    a.usable = true;
    return a;
  }();
  return api;
}

}  // namespace torchrr::recorder::cpython
