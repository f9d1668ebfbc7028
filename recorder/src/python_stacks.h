// Python stacks: the frames (file, line, function) of the Python code that issued an op.
//
// The one file that talks to CPython. It resolves CPython's functions at run time (dlsym), so the
// recorder loads in C++ programs that have no Python at all; there every call returns nothing.
// The op bindings release the GIL but keep their PyThreadState: the capture takes the GIL back
// briefly, walks the frames and releases it. Threads with no Python state are skipped.
#ifndef TORCHRR_RECORDER_PYTHON_STACKS_H_
#define TORCHRR_RECORDER_PYTHON_STACKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchrr::recorder {

struct PythonFrame {
  uint32_t code = 0;  // An id for the frame's code object (stable for the process).
  int32_t line = 0;
};

// A code object seen for the first time, described once.
struct PythonCode {
  uint32_t code = 0;
  std::string file;      // co_filename, as the program saw it.
  std::string function;  // co_qualname.
  bool framework = false;  // torch, site-packages, the standard library, torchrr.
};

// Writes up to `max` frames of the calling thread's Python stack into `out`, innermost first,
// and appends to `new_codes` the code objects never described before. Returns how many frames.
// Takes the GIL: the caller must hold no lock that a thread holding the GIL could wait for.
size_t CapturePythonStack(PythonFrame* out, size_t max, std::vector<PythonCode>* new_codes);

// The frame where a code object (a PyCodeObject*) begins, for a function that is not running (a
// saved-tensor hook): its id, with `first_line` (co_firstlineno) as the line. Appends the code's
// description to `new_codes`, every time. Takes the GIL, and the caller's reference to `code`. A
// frame with code 0 when Python is not running.
PythonFrame CodeDefinition(void* code, int32_t first_line, std::vector<PythonCode>* new_codes);

// Which way stacks are read: "frames" (CPython 3.11's frame structs read directly, checked
// against the API) or "api" (PyFrame_GetBack and friends, under the GIL). TORCHRR_PYTHON_WALKER=api
// forces the latter. Thread-safe.
const char* PythonStackWalkerName();

// The walker a runtime gets: "frames" only for CPython 3.11 (`py_version_hex`, PY_VERSION_HEX; 0
// when the runtime does not export Py_Version, as before 3.11) with PyFrame_GetLasti, and unless
// `api_forced`; "api" for every other version (3.10, 3.12, 3.13, ...), whose frame structs this
// file does not lay out. The API walk gives the same stacks, only slower. Pure: for tests.
const char* PythonStackWalkerFor(unsigned long py_version_hex, bool has_lasti, bool api_forced);

// True when a Python interpreter runs in this process now (initialized, as Py_IsInitialized says;
// false in a program without Python). Thread-safe.
bool PythonInterpreterRunning();

// Makes the next captures describe every code object again (into `new_codes`), for a new
// recording whose tables start empty. Code ids stay the same. Thread-safe; takes no lock.
void ForgetPythonCodeDescriptions();

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_PYTHON_STACKS_H_
