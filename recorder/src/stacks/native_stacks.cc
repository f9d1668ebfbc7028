#include "stacks/native_stacks.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <string_view>

#include <backtrace.h>

#include <boost/core/demangle.hpp>
#include <boost/stacktrace.hpp>

#include "stacks/checked_fast_path.h"
#include "stacks/libunwind_backtrace.h"

namespace torchrr::recorder {

namespace {

// unw_backtrace() starts inside libunwind: its frames and CaptureNativeStack's come before those
// Boost reports for the same `skip`. How many is learned on the first verified capture.
constexpr size_t kMaxLeadingFrames = 8;
// Captures checked against Boost.Stacktrace: the first ones, then one in kVerifyEvery.
constexpr uint64_t kVerifyFirst = 64;
constexpr uint64_t kVerifyEvery = 1024;

struct FastUnwinder {
  explicit FastUnwinder(UnwBacktraceFn unw)
      : unw(unw), path(unw != nullptr, kVerifyFirst, kVerifyEvery) {}
  const UnwBacktraceFn unw;
  CheckedFastPath path;
  std::atomic<int> lead{-1};  // Frames of unw_backtrace's result before Boost's first; -1: unknown.
};

FastUnwinder& Fast() {
  static FastUnwinder* fast = [] {
    const char* choice = std::getenv("TORCHRR_NATIVE_UNWINDER");
    bool boost_only = choice != nullptr && std::string_view(choice) == "boost";
    // Leaked: used until exit, by any thread.
    return new FastUnwinder(boost_only ? nullptr : LibunwindBacktrace());
  }();
  return *fast;
}

// True when libunwind's frames from `lead` on are Boost's, frame for frame, to the outermost (or
// to `max`, where Boost's may have been cut).
bool SameFrames(void* const* unw, size_t n_unw, size_t lead, void* const* boost, size_t n_boost,
                size_t max) {
  if (lead > n_unw) return false;
  size_t n_rest = n_unw - lead;
  if (n_boost >= max ? n_rest < n_boost : n_rest != n_boost) return false;
  return std::equal(boost, boost + n_boost, unw + lead);
}

}  // namespace

const char* NativeUnwinderName() {
  return Fast().path.enabled() ? "libunwind" : "boost";
}

size_t CaptureNativeStack(uintptr_t* out, size_t max, size_t skip) {
  max = std::min(max, kMaxNativeFrames);
  FastUnwinder& fast = Fast();
  std::array<void*, kMaxNativeFrames + kMaxLeadingFrames + 16> unw_frames;
  size_t n_unw = 0;
  int lead = -1;
  bool verify = true;
  if (fast.path.enabled()) {
    lead = fast.lead.load(std::memory_order_relaxed);
    verify = fast.path.NextCaptureIsChecked() || lead < 0;
    size_t want = max + (lead < 0 ? skip + 1 + kMaxLeadingFrames : static_cast<size_t>(lead));
    int n = fast.unw(unw_frames.data(), static_cast<int>(std::min(want, unw_frames.size())));
    n_unw = n > 0 ? static_cast<size_t>(n) : 0;
    if (!verify) {
      size_t written = 0;
      for (size_t i = lead; i < n_unw && written < max; ++i) {
        out[written++] = reinterpret_cast<uintptr_t>(unw_frames[i]);
      }
      return written;
    }
  }
  // Boost.Stacktrace: the reference, and the unwinder when libunwind is absent or disagreed once.
  // safe_dump_to writes void* addresses followed by a null terminator.
  std::array<void*, kMaxNativeFrames + 1> buffer;
  size_t n = boost::stacktrace::safe_dump_to(skip + 1, buffer.data(), sizeof(buffer));
  size_t n_boost = 0;
  while (n_boost < n && n_boost < max && buffer[n_boost] != nullptr) ++n_boost;
  if (n_unw > 0) {
    bool agrees = false;
    if (lead >= 0) {
      agrees = SameFrames(unw_frames.data(), n_unw, lead, buffer.data(), n_boost, max);
    } else {
      for (size_t l = 0; l <= skip + 1 + kMaxLeadingFrames && !agrees; ++l) {
        if (SameFrames(unw_frames.data(), n_unw, l, buffer.data(), n_boost, max)) {
          int unknown = -1;
          agrees = fast.lead.compare_exchange_strong(unknown, static_cast<int>(l)) ||
                   unknown == static_cast<int>(l);
        }
      }
    }
    if (!agrees) fast.path.Disable();
  }
  for (size_t i = 0; i < n_boost; ++i) out[i] = reinterpret_cast<uintptr_t>(buffer[i]);
  return n_boost;
}

namespace {

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != s.npos; }

std::string_view Basename(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == path.npos ? path : path.substr(slash + 1);
}

}  // namespace

bool IsFrameworkFrame(const std::string& function, const std::string& file,
                      const std::string& library) {
  static constexpr std::string_view kFrameworkLibraries[] = {
      "libtorch", "libc10", "libc.so", "libstdc++", "libgcc_s", "ld-linux", "libpthread",
      "libm.so", "libgomp", "libpython", "libboost", "libcuda", "libcudart", "libcupti",
      "libnvrtc", "libcublas", "libcudnn", "libshm", "libtorchrr", "libiomp", "libmkl",
      "libopenblas", "libdnnl", "libnccl", "_C.cpython", "libunwind"};
  std::string_view lib = Basename(library);
  if (StartsWith(lib, "python")) return true;  // An interpreter with libpython linked in.
  for (std::string_view prefix : kFrameworkLibraries) {
    if (StartsWith(lib, prefix)) return true;
  }
  static constexpr std::string_view kFrameworkNamespaces[] = {
      "at::", "c10::", "torch::", "std::", "__gnu_cxx::", "boost::", "caffe2::",
      "__libc_", "_start", "__cxa_", "_Py", "PyEval_", "PyObject_", "PyVectorcall_"};
  for (std::string_view prefix : kFrameworkNamespaces) {
    if (StartsWith(function, prefix)) return true;
  }
  // Inlined torch and standard-library code compiled into the user's binary.
  if (Contains(file, "/torch/include/") || Contains(file, "/include/c++/") ||
      Contains(file, "/boost/")) {
    return true;
  }
  return false;
}

namespace {

// libbacktrace (which Boost.Stacktrace's backtrace backend is built on) is used directly here
// because Boost's frame API reports only the innermost of the functions inlined at an address.
struct Backtrace {
  std::mutex mu;
  backtrace_state* state = nullptr;
  Backtrace() { state = backtrace_create_state(nullptr, /*threaded=*/1, &OnError, nullptr); }
  static void OnError(void*, const char*, int) {}  // Unknown frames stay unnamed.
};

Backtrace& GetBacktrace() {
  static Backtrace* backtrace = new Backtrace();  // Leaked: used until exit, by any thread.
  return *backtrace;
}

struct PcInfo {
  std::vector<SymbolizedFrame>* frames;
};

int OnPcInfo(void* data, uintptr_t, const char* file, int line, const char* function) {
  auto* info = static_cast<PcInfo*>(data);
  if (file == nullptr && function == nullptr) return 0;
  SymbolizedFrame frame;
  if (function != nullptr) frame.function = boost::core::demangle(function);
  if (file != nullptr) frame.file = file;
  frame.line = line > 0 ? static_cast<uint32_t>(line) : 0;
  info->frames->push_back(std::move(frame));
  return 0;
}

void OnSymInfo(void* data, uintptr_t, const char* symbol, uintptr_t, uintptr_t) {
  if (symbol != nullptr) *static_cast<std::string*>(data) = boost::core::demangle(symbol);
}

}  // namespace

std::vector<SymbolizedFrame> SymbolizeUncached(uintptr_t return_address);

std::vector<SymbolizedFrame> SymbolizeNativeFrame(uintptr_t return_address) {
  // Addresses of the same process symbolize the same way: once per process, not per recording.
  static std::mutex cache_mu;
  static auto* cache = new std::unordered_map<uintptr_t, std::vector<SymbolizedFrame>>();
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache->find(return_address);
    if (it != cache->end()) return it->second;
  }
  std::vector<SymbolizedFrame> frames = SymbolizeUncached(return_address);
  std::lock_guard<std::mutex> lock(cache_mu);
  cache->emplace(return_address, frames);
  return frames;
}

std::vector<SymbolizedFrame> SymbolizeUncached(uintptr_t return_address) {
  uintptr_t call_site = return_address - 1;
  std::vector<SymbolizedFrame> frames;
  Backtrace& backtrace = GetBacktrace();
  {
    std::lock_guard<std::mutex> lock(backtrace.mu);
    if (backtrace.state != nullptr) {
      PcInfo info{&frames};
      backtrace_pcinfo(backtrace.state, call_site, &OnPcInfo, &Backtrace::OnError, &info);
      if (frames.empty()) {
        SymbolizedFrame frame;
        backtrace_syminfo(backtrace.state, call_site, &OnSymInfo, &Backtrace::OnError,
                          &frame.function);
        frames.push_back(std::move(frame));
      }
    }
  }
  if (frames.empty()) frames.emplace_back();
  std::string library;
  Dl_info dl{};
  if (dladdr(reinterpret_cast<const void*>(call_site), &dl) != 0 && dl.dli_fname != nullptr) {
    library = dl.dli_fname;
    if (frames.back().function.empty() && dl.dli_sname != nullptr) {
      frames.back().function = boost::core::demangle(dl.dli_sname);
    }
  }
  for (auto& frame : frames) {
    frame.library = library;
    frame.framework = IsFrameworkFrame(frame.function, frame.file, frame.library);
  }
  return frames;
}

}  // namespace torchrr::recorder
