#include "stacks/python_stacks.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "stacks/checked_fast_path.h"
#include "stacks/cpython_api.h"

namespace torchrr::recorder {
namespace {

using cpython::Api;
using cpython::CPython;
using cpython::PyCodeObject;
using cpython::PyFrameObject;
using cpython::PyGILStateState;
using cpython::PyObject;
using cpython::PyThreadState;

// Every code object seen, interned to a small id. Guarded by the GIL.
struct CodeEntry {
  uint32_t id = 0;
  uint64_t described_epoch = 0;  // The recording epoch it was last described in.
  // Instruction offset -> line. PyFrame_GetLineNumber scans the code's whole line table on every
  // call (CPython 3.11), which made it most of the recorder's cost per op in Python programs; the
  // line of an offset never changes (code objects are immutable and kept alive, see InternCode).
  std::unordered_map<int, int> lines;
  // Code torch.fx generated: each line's origin (GeneratedLineOrigins), read once.
  std::vector<PythonLineOrigin> origins;
  // torch.fx's Interpreter.run_node: the origin is the node it runs, read at each capture.
  bool node_runner = false;
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

// The bytes of a str that is not UTF-8: a path Python decoded with surrogate escapes (a directory
// named in Latin-1) encoded back the way it was decoded; "" (clearing the error) when it cannot be.
std::string FileSystemBytes(const CPython& py, PyObject* str) {
  if (py.PyUnicode_EncodeFSDefault == nullptr) return {};
  PyObject* bytes = py.PyUnicode_EncodeFSDefault(str);
  if (bytes == nullptr) {
    py.PyErr_Clear();
    return {};
  }
  char* data = nullptr;
  ssize_t size = 0;
  std::string text;
  if (py.PyBytes_AsStringAndSize(bytes, &data, &size) == 0 && data != nullptr && size >= 0) {
    text.assign(data, static_cast<size_t>(size));
  } else {
    py.PyErr_Clear();
  }
  py.Py_DecRef(bytes);
  return text;
}

// A str attribute of `object` as UTF-8 (a file path that is not UTF-8: its bytes), or "" (clearing
// the error) when missing.
std::string StrAttr(const CPython& py, PyObject* object, const char* name) {
  PyObject* value = py.PyObject_GetAttrString(object, name);
  if (value == nullptr) {
    py.PyErr_Clear();
    return {};
  }
  const char* utf8 = py.PyUnicode_AsUTF8(value);
  std::string text;
  if (utf8 != nullptr) {
    text = utf8;
  } else {
    py.PyErr_Clear();
    text = FileSystemBytes(py, value);
  }
  py.Py_DecRef(value);
  return text;
}

std::string ParentDir(const std::string& file) {
  auto slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash + 1);
}

// A module already imported (sys.modules[name], borrowed), or null: nothing is imported here.
PyObject* LoadedModule(const CPython& py, const char* name) {
  PyObject* modules = py.PyImport_GetModuleDict();
  return modules == nullptr ? nullptr : py.PyDict_GetItemString(modules, name);
}

// The package directory of an imported module (`torch` -> ".../site-packages/torch/"), or "".
std::string ModuleDir(const CPython& py, const char* module_name) {
  PyObject* module = LoadedModule(py, module_name);
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
  // The code inductor generates for a compiled graph, in its cache (/tmp/torchinductor_USER/ by
  // default): torch's, not the user's lines.
  if (file.find("/torchinductor_") != std::string::npos) return true;
  for (const auto& prefix : Framework(py).prefixes) {
    if (file.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

// The source torch.fx generated and ran as `file` ("<eval_with_key>.N", its key), or "". torch.fx
// keeps every module's source in torch.fx.graph_module._loader.eval_cache, a dict under that key
// (the loader linecache asks, since torch 1.x): read with lookups only, running no Python code.
// Holds the GIL.
std::string GeneratedSource(const CPython& py, const std::string& file) {
  PyObject* module = LoadedModule(py, "torch.fx.graph_module");
  if (module == nullptr) return {};
  PyObject* loader = py.PyObject_GetAttrString(module, "_loader");
  PyObject* cache = loader == nullptr ? nullptr : py.PyObject_GetAttrString(loader, "eval_cache");
  std::string text;
  if (cache != nullptr) {
    // Not a dict, or no such key: null, with no error set.
    PyObject* source = py.PyDict_GetItemString(cache, file.c_str());
    const char* utf8 = source == nullptr ? nullptr : py.PyUnicode_AsUTF8(source);
    if (utf8 != nullptr) text = utf8;
  }
  py.PyErr_Clear();
  if (cache != nullptr) py.Py_DecRef(cache);
  if (loader != nullptr) py.Py_DecRef(loader);
  return text;
}

// What the trace says of a code object: its file and qualified name. Holds the GIL.
PythonCode Describe(const CPython& py, PyCodeObject* code, uint32_t id) {
  PythonCode description;
  description.code = id;
  description.file = StrAttr(py, code, "co_filename");
  description.function = StrAttr(py, code, "co_qualname");  // 3.11+.
  if (description.function.empty()) description.function = StrAttr(py, code, "co_name");
  description.framework = IsFramework(py, description.file);
  return description;
}

// The code ids of origins (PythonFrame::origin_code), by file and function, from the same counter
// as code objects'. Guarded by the GIL.
struct OriginCode {
  uint32_t id = 0;
  uint64_t described_epoch = 0;
};
std::unordered_map<std::string, OriginCode>* g_origin_codes = nullptr;

// The code id of an origin's file and function, described into `new_codes` when first seen in
// this recording epoch. Holds the GIL.
uint32_t InternOrigin(const CPython& py, const PythonLineOrigin& origin, uint64_t epoch,
                      std::vector<PythonCode>* new_codes) {
  if (g_origin_codes == nullptr) g_origin_codes = new std::unordered_map<std::string, OriginCode>();
  std::string key = origin.file;
  key.push_back('\0');
  key.append(origin.function);
  auto [it, created] = g_origin_codes->try_emplace(std::move(key));
  if (created) it->second.id = ++g_next_code;
  if (it->second.described_epoch != epoch && new_codes != nullptr) {
    it->second.described_epoch = epoch;
    new_codes->push_back({it->second.id, origin.file, origin.function, IsFramework(py, origin.file)});
  }
  return it->second.id;
}

// The user's line that the torch.fx graph node being run now was traced from: the innermost frame
// of its traceback outside framework code (else the innermost), from the node's meta, which
// torch.fx.traceback.current_meta holds while an Interpreter runs the node under
// preserve_node_meta() (as AOTAutograd traces a graph; torch 2.x). Read with lookups only. Holds
// the GIL.
std::optional<PythonLineOrigin> CurrentNodeOrigin(const CPython& py) {
  PyObject* module = LoadedModule(py, "torch.fx.traceback");
  if (module == nullptr) return std::nullopt;
  PyObject* meta = py.PyObject_GetAttrString(module, "current_meta");
  std::vector<PythonLineOrigin> frames;
  if (meta != nullptr) {
    PyObject* stack_trace = py.PyDict_GetItemString(meta, "stack_trace");  // Not a dict: null.
    const char* utf8 = stack_trace == nullptr ? nullptr : py.PyUnicode_AsUTF8(stack_trace);
    if (utf8 != nullptr) frames = TracebackFrames(utf8);
    py.Py_DecRef(meta);
  }
  py.PyErr_Clear();
  if (frames.empty()) return std::nullopt;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    if (!IsFramework(py, it->file)) return std::move(*it);
  }
  return std::move(frames.back());
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
    std::string file = StrAttr(py, code, "co_filename");
    if (file.starts_with("<eval_with_key>")) {
      entry.origins = GeneratedLineOrigins(GeneratedSource(py, file));
    } else if (file.ends_with("/torch/fx/interpreter.py")) {
      entry.node_runner = StrAttr(py, code, "co_name") == "run_node";
    }
  }
  if (entry.described_epoch != epoch && new_codes != nullptr) {
    entry.described_epoch = epoch;
    new_codes->push_back(Describe(py, code, entry.id));
  }
  return entry;
}

// The frame's current line, as PyFrame_GetLineNumber gives it. That is PyCode_Addr2Line of the
// frame's last instruction (CPython sets a frame's own f_lineno only for the duration of a trace
// call, to that same line), so it is cached per offset. Holds the GIL.
int LineOf(const CPython& py, PyFrameObject* frame, PyCodeObject* code, CodeEntry& entry,
           int* lasti_out) {
  if (py.PyFrame_GetLasti == nullptr) return py.PyFrame_GetLineNumber(frame);
  int lasti = py.PyFrame_GetLasti(frame);
  *lasti_out = lasti;
  auto [it, created] = entry.lines.try_emplace(lasti, 0);
  if (created) it->second = py.PyCode_Addr2Line(code, lasti);
  return it->second;
}

// The fast path, on CPython 3.11: the calling thread's frames read straight from the interpreter's
// own frame structs, without the GIL and without the frame objects PyFrame_GetBack creates for
// every frame it passes (an allocation, and a garbage-collector object, per frame). Each frame
// gives its code object and instruction offset, and a per-thread cache maps those to the ids and
// lines the API path found for them. The offsets are CPython 3.11's (cpython/pystate.h,
// internal/pycore_frame.h, cpython/code.h): used only when the running interpreter says it is 3.11,
// and only while the walk agrees with the API's, frame for frame, on the first kVerifyFirst
// captures and on one in kVerifyEvery after them; one disagreement turns it off for the process.
// Reading the frames without the GIL is safe for the calling thread's own stack: only this thread
// links and unlinks its frames, and it is inside the op that is being recorded.
namespace py311 {
constexpr size_t kThreadCFrame = 56;        // PyThreadState.cframe
constexpr size_t kCFrameCurrentFrame = 8;   // _PyCFrame.current_frame
constexpr size_t kFrameCode = 32;           // _PyInterpreterFrame.f_code
constexpr size_t kFramePrevious = 48;       // _PyInterpreterFrame.previous
constexpr size_t kFramePrevInstr = 56;      // _PyInterpreterFrame.prev_instr
constexpr size_t kFrameOwner = 69;          // _PyInterpreterFrame.owner
constexpr char kOwnedByGenerator = 1;       // FRAME_OWNED_BY_GENERATOR
constexpr size_t kCodeFirstTraceable = 168;  // PyCodeObject._co_firsttraceable
constexpr size_t kCodeAdaptive = 184;       // PyCodeObject.co_code_adaptive: _PyCode_CODE()
constexpr size_t kCodeUnit = 2;             // sizeof(_Py_CODEUNIT)
}  // namespace py311

constexpr uint64_t kVerifyFirst = 256;
constexpr uint64_t kVerifyEvery = 4096;

// Trivial (no member initializers): CapturePythonStack's array of them is not zeroed on every call.
struct RawFrame {
  const void* code;
  int lasti;  // In bytes, as PyFrame_GetLasti gives it.
};

CheckedFastPath& Fast(const CPython& py) {
  static CheckedFastPath* fast = [&py] {
    const char* choice = std::getenv("TORCHRR_PYTHON_WALKER");
    bool api_only = choice != nullptr && std::string_view(choice) == "api";
    const char* walker = PythonStackWalkerFor(py.Py_Version != nullptr ? *py.Py_Version : 0,
                                              py.PyFrame_GetLasti != nullptr, api_only);
    // Leaked: used until exit, by any thread.
    return new CheckedFastPath(std::string_view(walker) == "frames", kVerifyFirst, kVerifyEvery);
  }();
  return *fast;
}

template <typename T>
T Field(const void* base, size_t offset) {
  T value;
  std::memcpy(&value, static_cast<const char*>(base) + offset, sizeof(T));
  return value;
}

// The frames PyThreadState_GetFrame and PyFrame_GetBack would give, innermost first: incomplete
// frames (_PyFrame_IsIncomplete) are skipped as they skip them.
size_t WalkFrames311(PyThreadState* thread, RawFrame* out, size_t max) {
  using namespace py311;
  const void* cframe = Field<const void*>(thread, kThreadCFrame);
  if (cframe == nullptr) return 0;
  const char* frame = Field<const char*>(cframe, kCFrameCurrentFrame);
  size_t n = 0;
  while (frame != nullptr && n < max) {
    const char* code = Field<const char*>(frame, kFrameCode);
    const char* prev_instr = Field<const char*>(frame, kFramePrevInstr);
    const char* first = code + kCodeAdaptive;
    bool incomplete =
        Field<char>(frame, kFrameOwner) != kOwnedByGenerator &&
        prev_instr < first + kCodeUnit * Field<int>(code, kCodeFirstTraceable);
    if (!incomplete) {
      auto units = static_cast<int>((prev_instr - first) / static_cast<ptrdiff_t>(kCodeUnit));
      out[n].code = code;
      out[n].lasti = units < 0 ? -1 : units * static_cast<int>(kCodeUnit);
      ++n;
    }
    frame = Field<const char*>(frame, kFramePrevious);
  }
  return n;
}

// (code object, instruction offset) -> (code id, line), as the API path found them, per thread:
// no lock. An entry counts only in the recording epoch it was filled in (each recording describes
// its code objects again, on the API path). Code objects are never freed once interned, so an
// address stands for one code object.
// Trivial, so that the thread_local needs no initialization check on each access (it is zeroed as
// any thread_local is; epoch 0 matches no recording).
struct LineCacheEntry {
  const void* code;
  int lasti;
  int32_t line;
  uint32_t id;
  uint32_t origin_code;
  int32_t origin_line;
  bool node_runner;  // Its origin changes with each node: the API path reads it every time.
  uint64_t epoch;
};
constexpr int kLineCacheBits = 12;  // 128 KiB per thread: a step's call sites collide less.
using LineCache = std::array<LineCacheEntry, size_t{1} << kLineCacheBits>;
thread_local LineCache t_line_cache;

LineCacheEntry& CacheSlot(LineCache& cache, const RawFrame& f) {
  uint64_t key = reinterpret_cast<uintptr_t>(f.code) ^ (static_cast<uint64_t>(f.lasti) << 40);
  key *= 0x9e3779b97f4a7c15ULL;
  return cache[key >> (64 - kLineCacheBits)];
}

}  // namespace

const char* PythonStackWalkerFor(unsigned long py_version_hex, bool has_lasti, bool api_forced) {
  const bool is_311 = (py_version_hex >> 16) == 0x030b;
  return !api_forced && is_311 && has_lasti ? "frames" : "api";
}

const char* PythonStackWalkerName() {
  const CPython& py = Api();
  if (!py.usable) return "api";
  return Fast(py).enabled() ? "frames" : "api";
}

namespace {

// How many libraries the process has loaded so far (dl_iterate_phdr's count, read from the first
// object it reports: one callback, not a walk of them all).
unsigned long long LibrariesLoaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
          *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        }
        return 1;
      },
      &adds);
  return adds;
}

}  // namespace

bool PythonInterpreterRunning() {
  // Not through Api(): that resolves once, and this may be asked before a program loads Python.
  // The recorder asks at every forward op's end, and dlsym with RTLD_DEFAULT finds its caller's
  // library among all those loaded (hundreds in a Python process with torch), then looks in each
  // (all of them, and an error message allocated, when the symbol is not there): more than the
  // op's ids cost. So the symbol is kept once found (libpython is never unloaded), and a lookup
  // that failed is not made again until the process loads another library.
  using Initialized = int (*)();
  static std::atomic<Initialized> found{nullptr};
  static std::atomic<unsigned long long> missing_at{0};  // Loads counted at the failed lookup.
  Initialized initialized = found.load(std::memory_order_acquire);
  if (initialized == nullptr) {
    const unsigned long long loaded = LibrariesLoaded();
    if (loaded != 0 && loaded == missing_at.load(std::memory_order_relaxed)) return false;
    initialized = reinterpret_cast<Initialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    if (initialized == nullptr) {
      missing_at.store(loaded, std::memory_order_relaxed);
      return false;
    }
    found.store(initialized, std::memory_order_release);
  }
  return initialized() != 0;
}

void ForgetPythonCodeDescriptions() { g_epoch.fetch_add(1, std::memory_order_acq_rel); }

PythonFrame CodeDefinition(void* code, int32_t first_line, std::vector<PythonCode>* new_codes) {
  PythonFrame frame;
  const CPython& py = Api();
  if (code == nullptr || !py.usable || !py.Py_IsInitialized()) return frame;
  if (py.IsFinalizing != nullptr && py.IsFinalizing()) return frame;  // Taking the GIL could hang.
  PyGILStateState gil = py.PyGILState_Ensure();
  auto* code_object = static_cast<PyCodeObject*>(code);
  frame.code = InternCode(py, code_object, g_epoch.load(std::memory_order_acquire), nullptr).id;
  frame.line = first_line;
  // Described every time, not once per recording: what a node's hooks were read into may be
  // dropped unrecorded (a node left to an enclosing op's end, read again there), and the
  // interner must know the code when the NodeRecord names it.
  new_codes->push_back(Describe(py, code_object, frame.code));
  py.Py_DecRef(code_object);  // InternCode holds its own.
  py.PyGILState_Release(gil);
  return frame;
}

size_t TracebackStack(std::string_view stack_trace, PythonFrame* out, size_t max,
                      std::vector<PythonCode>* new_codes) {
  std::vector<PythonLineOrigin> frames = TracebackFrames(stack_trace);
  if (frames.empty() || max == 0) return 0;
  const CPython& py = Api();
  if (!py.usable || !py.Py_IsInitialized()) return 0;
  if (py.IsFinalizing != nullptr && py.IsFinalizing()) return 0;  // Taking the GIL could hang.
  PyGILStateState gil = py.PyGILState_Ensure();
  const uint64_t epoch = g_epoch.load(std::memory_order_acquire);
  size_t n = 0;
  for (auto it = frames.rbegin(); it != frames.rend() && n < max; ++it, ++n) {
    out[n].code = InternOrigin(py, *it, epoch, nullptr);
    out[n].line = it->origin_line;
    new_codes->push_back({out[n].code, it->file, it->function, IsFramework(py, it->file)});
  }
  py.PyGILState_Release(gil);
  return n;
}

size_t CapturePythonStack(PythonFrame* out, size_t max, std::vector<PythonCode>* new_codes) {
  if (max == 0) return 0;
  const CPython& py = Api();
  if (!py.usable || !py.Py_IsInitialized()) return 0;
  if (py.IsFinalizing != nullptr && py.IsFinalizing()) return 0;  // Taking the GIL could hang.
  PyThreadState* thread = py.PyGILState_GetThisThreadState();
  if (thread == nullptr) return 0;  // A thread that never ran Python (autograd's, a C++ pool's).
  uint64_t epoch = g_epoch.load(std::memory_order_acquire);

  CheckedFastPath& fast = Fast(py);
  constexpr size_t kMaxRaw = 64;
  std::array<RawFrame, kMaxRaw> raw;
  size_t n_raw = 0;
  const bool use_fast = fast.enabled() && max <= kMaxRaw;
  auto& cache = t_line_cache;
  if (use_fast) {
    n_raw = WalkFrames311(thread, raw.data(), max);
    if (!fast.NextCaptureIsChecked()) {
      size_t i = 0;
      for (; i < n_raw; ++i) {
        const LineCacheEntry& entry = CacheSlot(cache, raw[i]);
        if (entry.code != raw[i].code || entry.lasti != raw[i].lasti || entry.epoch != epoch ||
            entry.node_runner) {
          break;
        }
        out[i] = {entry.id, entry.line, entry.origin_code, entry.origin_line};
      }
      if (i == n_raw) return n_raw;
    }
  }

  // The API path: under the GIL, through frame objects. It also describes new code objects and
  // fills the fast path's cache.
  PyGILStateState gil = py.PyGILState_Ensure();
  size_t n = 0;
  bool agrees = true;
  PyFrameObject* frame = py.PyThreadState_GetFrame(thread);
  while (frame != nullptr && n < max) {
    PyCodeObject* code = py.PyFrame_GetCode(frame);
    CodeEntry& entry = InternCode(py, code, epoch, new_codes);
    int lasti = 0;
    out[n].code = entry.id;
    out[n].line = LineOf(py, frame, code, entry, &lasti);
    out[n].origin_code = 0;
    out[n].origin_line = 0;
    std::optional<PythonLineOrigin> node_origin;
    const PythonLineOrigin* origin = nullptr;
    if (!entry.origins.empty()) {
      origin = OriginOfLine(entry.origins, out[n].line);
    } else if (entry.node_runner && (node_origin = CurrentNodeOrigin(py))) {
      origin = &*node_origin;
    }
    if (origin != nullptr) {
      out[n].origin_code = InternOrigin(py, *origin, epoch, new_codes);
      out[n].origin_line = origin->origin_line;
    }
    if (use_fast) {
      if (n < n_raw && raw[n].code == code && raw[n].lasti == lasti) {
        CacheSlot(cache, raw[n]) = {code,          lasti, out[n].line, out[n].code,
                                    out[n].origin_code, out[n].origin_line, entry.node_runner,
                                    epoch};
      } else {
        agrees = false;
      }
    }
    py.Py_DecRef(code);
    ++n;
    PyFrameObject* back = py.PyFrame_GetBack(frame);
    py.Py_DecRef(frame);
    frame = back;
  }
  if (frame != nullptr) py.Py_DecRef(frame);
  py.PyGILState_Release(gil);
  if (use_fast && (!agrees || n != n_raw)) {
    fast.Disable();  // This interpreter's frames are not laid out as the fast path reads them.
  }
  return n;
}

}  // namespace torchrr::recorder
