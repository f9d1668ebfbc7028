#include "python_stacks.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// No Python headers: every CPython function is declared here with an opaque PyObject and resolved
// with dlsym(RTLD_DEFAULT) the first time a stack is captured. The functions used are all in the
// stable ABI of CPython 3.9+ (PyFrame_GetCode, PyFrame_GetBack, PyThreadState_GetFrame), except
// PyUnicode_AsUTF8 (exported by every CPython 3 build) and the finalization check, which is
// optional (_Py_IsFinalizing until 3.12, Py_IsFinalizing from 3.13).

namespace torchrr::recorder {
namespace {

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
  void (*PyErr_Clear)() = nullptr;
  PyObject* (*PySys_GetObject)(const char*) = nullptr;  // Borrowed reference.
  PyObject* (*PyImport_GetModuleDict)() = nullptr;      // Borrowed reference.
  PyObject* (*PyDict_GetItemString)(PyObject*, const char*) = nullptr;  // Borrowed reference.
  bool usable = false;  // Every required function was found.
};

template <typename F>
bool Resolve(F*& f, const char* name) {
  f = reinterpret_cast<F*>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

const CPython& Api() {
  static const CPython api = [] {
    CPython a;
    bool ok = Resolve(a.Py_IsInitialized, "Py_IsInitialized");
    // Without the interpreter's symbols (a C++ program) there is nothing more to look for.
    if (!ok) return a;
    if (!Resolve(a.IsFinalizing, "Py_IsFinalizing")) Resolve(a.IsFinalizing, "_Py_IsFinalizing");
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

// Every code object seen, interned to a small id. Guarded by the GIL.
struct CodeEntry {
  uint32_t id = 0;
  uint64_t described_epoch = 0;  // The recording epoch it was last described in.
  // Instruction offset -> line. PyFrame_GetLineNumber scans the code's whole line table on every
  // call (CPython 3.11), which made it most of the recorder's cost per op in Python programs; the
  // line of an offset never changes (code objects are immutable and kept alive, see InternCode).
  std::unordered_map<int, int> lines;
};
std::unordered_map<PyCodeObject*, CodeEntry>* g_codes = nullptr;  // Guarded by the GIL.
uint32_t g_next_code = 0;                                          // Guarded by the GIL.

// Bumped by ForgetPythonCodeDescriptions: each recording needs every code object described.
std::atomic<uint64_t> g_epoch{1};

// Directories whose code is framework code, found once (guarded by the GIL).
struct FrameworkDirs {
  bool found = false;
  std::vector<std::string> prefixes;  // Each ends with '/'.
};
FrameworkDirs* g_framework = nullptr;  // Guarded by the GIL.

// A str attribute of `object` as UTF-8, or "" (clearing the error) when missing.
std::string StrAttr(const CPython& py, PyObject* object, const char* name) {
  PyObject* value = py.PyObject_GetAttrString(object, name);
  if (value == nullptr) {
    py.PyErr_Clear();
    return {};
  }
  const char* utf8 = py.PyUnicode_AsUTF8(value);
  std::string text = utf8 != nullptr ? utf8 : "";
  if (utf8 == nullptr) py.PyErr_Clear();
  py.Py_DecRef(value);
  return text;
}

std::string ParentDir(const std::string& file) {
  auto slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash + 1);
}

// The package directory of an imported module (`torch` -> ".../site-packages/torch/"), or "".
std::string ModuleDir(const CPython& py, const char* module_name) {
  PyObject* modules = py.PyImport_GetModuleDict();
  if (modules == nullptr) return {};
  PyObject* module = py.PyDict_GetItemString(modules, module_name);
  if (module == nullptr) return {};
  return ParentDir(StrAttr(py, module, "__file__"));
}

// Fills g_framework: the interpreter's prefixes' lib/python (the standard library, and
// site-packages under them) and the torch and torchrr packages wherever they are installed.
// torch is looked for again until found: it may be imported after the first capture.
const FrameworkDirs& Framework(const CPython& py) {
  if (g_framework == nullptr) {
    g_framework = new FrameworkDirs();
    for (const char* name : {"base_prefix", "prefix", "base_exec_prefix", "exec_prefix"}) {
      PyObject* value = py.PySys_GetObject(name);
      if (value == nullptr) continue;
      const char* utf8 = py.PyUnicode_AsUTF8(value);
      if (utf8 == nullptr) {
        py.PyErr_Clear();
        continue;
      }
      std::string dir = std::string(utf8) + "/lib/python";
      if (*utf8 != '\0') g_framework->prefixes.push_back(dir);  // lib/python3.X/, lib/python3/.
    }
    std::string own = ModuleDir(py, "torchrr");
    if (!own.empty()) g_framework->prefixes.push_back(own);
  }
  if (!g_framework->found) {
    std::string torch_dir = ModuleDir(py, "torch");
    if (!torch_dir.empty()) {
      g_framework->prefixes.push_back(torch_dir);
      g_framework->found = true;
    }
  }
  return *g_framework;
}

bool IsFramework(const CPython& py, const std::string& file) {
  if (file.rfind("<frozen ", 0) == 0) return true;
  if (file.find("/site-packages/") != std::string::npos ||
      file.find("/dist-packages/") != std::string::npos) {
    return true;
  }
  // torchrr's own package, also when imported from a source tree (recorder/python/torchrr/).
  if (file.find("/torchrr/_sitecustomize/") != std::string::npos) return true;
  for (const auto& prefix : Framework(py).prefixes) {
    if (file.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

// The entry of `code`, interning it (and describing it into `new_codes`) when first seen in this
// recording epoch. Holds the GIL.
CodeEntry& InternCode(const CPython& py, PyCodeObject* code, uint64_t epoch,
                      std::vector<PythonCode>* new_codes) {
  if (g_codes == nullptr) g_codes = new std::unordered_map<PyCodeObject*, CodeEntry>();
  auto [it, created] = g_codes->try_emplace(code);
  CodeEntry& entry = it->second;
  if (created) {
    // A reference held for the life of the process: the address is never reused by another
    // code object, so an id always means the same code.
    py.Py_IncRef(code);
    entry.id = ++g_next_code;
  }
  if (entry.described_epoch != epoch && new_codes != nullptr) {
    entry.described_epoch = epoch;
    PythonCode description;
    description.code = entry.id;
    description.file = StrAttr(py, code, "co_filename");
    description.function = StrAttr(py, code, "co_qualname");  // 3.11+.
    if (description.function.empty()) description.function = StrAttr(py, code, "co_name");
    description.framework = IsFramework(py, description.file);
    new_codes->push_back(std::move(description));
  }
  return entry;
}

// The frame's current line, as PyFrame_GetLineNumber gives it. That is PyCode_Addr2Line of the
// frame's last instruction (CPython sets a frame's own f_lineno only for the duration of a trace
// call, to that same line), so it is cached per offset. Holds the GIL.
int LineOf(const CPython& py, PyFrameObject* frame, PyCodeObject* code, CodeEntry& entry) {
  if (py.PyFrame_GetLasti == nullptr) return py.PyFrame_GetLineNumber(frame);
  int lasti = py.PyFrame_GetLasti(frame);
  auto [it, created] = entry.lines.try_emplace(lasti, 0);
  if (created) it->second = py.PyCode_Addr2Line(code, lasti);
  return it->second;
}

}  // namespace

void ForgetPythonCodeDescriptions() { g_epoch.fetch_add(1, std::memory_order_acq_rel); }

size_t CapturePythonStack(PythonFrame* out, size_t max, std::vector<PythonCode>* new_codes) {
  if (max == 0) return 0;
  const CPython& py = Api();
  if (!py.usable || !py.Py_IsInitialized()) return 0;
  if (py.IsFinalizing != nullptr && py.IsFinalizing()) return 0;  // Taking the GIL could hang.
  PyThreadState* thread = py.PyGILState_GetThisThreadState();
  if (thread == nullptr) return 0;  // A thread that never ran Python (autograd's, a C++ pool's).
  uint64_t epoch = g_epoch.load(std::memory_order_acquire);

  PyGILStateState gil = py.PyGILState_Ensure();
  size_t n = 0;
  PyFrameObject* frame = py.PyThreadState_GetFrame(thread);
  while (frame != nullptr && n < max) {
    PyCodeObject* code = py.PyFrame_GetCode(frame);
    CodeEntry& entry = InternCode(py, code, epoch, new_codes);
    out[n].code = entry.id;
    out[n].line = LineOf(py, frame, code, entry);
    py.Py_DecRef(code);
    ++n;
    PyFrameObject* back = py.PyFrame_GetBack(frame);
    py.Py_DecRef(frame);
    frame = back;
  }
  if (frame != nullptr) py.Py_DecRef(frame);
  py.PyGILState_Release(gil);
  return n;
}

}  // namespace torchrr::recorder
