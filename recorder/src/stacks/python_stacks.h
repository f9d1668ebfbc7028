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
#include <string_view>
#include <vector>

namespace torchrr::recorder {

struct PythonFrame {
  uint32_t code = 0;  // An id for the frame's code object (stable for the process).
  int32_t line = 0;
  // Where the user's code is that this frame runs on its behalf, when torch traced it into a
  // graph: the line a torch.fx module's generated line was made from, or the line of the graph
  // node a torch.fx Interpreter runs (torch.compile's AOTAutograd traces the graph so). A code id
  // standing for the user's file and function (described as any code is), and the line; 0, 0
  // for none.
  uint32_t origin_code = 0;
  int32_t origin_line = 0;
};

// Where a line of generated code came from: the user's line it was traced from.
struct PythonLineOrigin {
  int32_t line = 0;         // The generated code's line.
  std::string file;         // The user's file, line and function, as torch names them.
  int32_t origin_line = 0;
  std::string function;
};

// A code object seen for the first time, described once; or the user's file and function that an
// origin names (PythonFrame::origin_code).
struct PythonCode {
  uint32_t code = 0;
  std::string file;      // co_filename, as the program saw it.
  std::string function;  // co_qualname.
  bool framework = false;  // torch, site-packages, the standard library, torchrr.
};

// The origin of each code line of a torch.fx module's source, as torch.fx writes it: a comment
// "# File: /path/train.py:68 in forward, code: x.relu_()" (possibly after other annotations, or
// "Backward of forward node: " before "File:") above the lines generated from that user line, in
// force until the next such comment or "# No stacktrace found for following nodes". Lines are
// 1-based; comment and blank lines get none. Pure: for tests.
std::vector<PythonLineOrigin> GeneratedLineOrigins(std::string_view source);

// The origin of `line` in `origins` (sorted by line), or null.
const PythonLineOrigin* OriginOfLine(const std::vector<PythonLineOrigin>& origins, int32_t line);

// The frames of a Python traceback as torch.fx keeps it for a graph node (node.meta
// ["stack_trace"]: `  File "/path/train.py", line 68, in forward\n    code\n` per frame),
// outermost first, each with `line` 0. Pure: for tests.
std::vector<PythonLineOrigin> TracebackFrames(std::string_view stack_trace);

// The frames of a torch.fx traceback (TracebackFrames), innermost first, as PythonFrames of up to
// `max`: each the code id of its file and function (the ids origins get) and its line. Appends
// the description of each code it names to `new_codes`, every time (as CodeDefinition). Takes
// the GIL; nothing when Python is not running.
size_t TracebackStack(std::string_view stack_trace, PythonFrame* out, size_t max,
                      std::vector<PythonCode>* new_codes);

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
