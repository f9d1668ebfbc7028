// C++ stacks: captured cheaply as return addresses on the training thread (libunwind's cached
// unwinder when installed, checked against Boost.Stacktrace; Boost.Stacktrace otherwise),
// symbolized (function, file, line, library) once per unique address on the writer thread,
// before the frame's first use is written, so the trace reads on another machine.
#ifndef TORCHRR_RECORDER_NATIVE_STACKS_H_
#define TORCHRR_RECORDER_NATIVE_STACKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchrr::recorder {

inline constexpr size_t kMaxNativeFrames = 64;

// Writes up to `max` (at most kMaxNativeFrames) return addresses of the calling thread's stack into
// `out`, innermost first, skipping `skip` frames above the caller. Returns how many.
// Allocation-free; thread-safe.
//
// Boost.Stacktrace (libgcc's unwinder) is the reference. When libunwind is installed its
// unw_backtrace() is used instead (libunwind_backtrace.h: several times faster on the stacks a
// training step repeats), checked against Boost's result on the first 64 captures of the process
// and on one in 1024 after that; the first disagreement switches to Boost for the rest of the
// process (that capture returns Boost's frames). TORCHRR_NATIVE_UNWINDER=boost forces Boost.
size_t CaptureNativeStack(uintptr_t* out, size_t max, size_t skip);

// The unwinder CaptureNativeStack uses now: "libunwind" or "boost".
const char* NativeUnwinderName();

struct SymbolizedFrame {
  std::string function;  // Demangled; empty when unknown.
  std::string file;      // Source file from debug info; empty when unknown.
  uint32_t line = 0;
  std::string library;   // The shared object or executable holding the address.
  bool framework = false;
};

// Symbolizes one return address (the call site, i.e. address - 1, is looked up) into the frames
// it stands for: with debug info, one per inlined function, innermost first (an optimized build
// inlines the user's helpers into their callers, and those are the lines users need); without,
// one frame named from the symbol table. Slow (reads debug info); call once per unique address.
// Thread-safe.
std::vector<SymbolizedFrame> SymbolizeNativeFrame(uintptr_t return_address);

// True for frames of torch, the C++ runtime and standard library, Python's interpreter, Boost and
// torchrr itself: everything that is not the user's code.
bool IsFrameworkFrame(const std::string& function, const std::string& file,
                      const std::string& library);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_NATIVE_STACKS_H_
