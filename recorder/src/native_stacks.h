// C++ stacks through Boost.Stacktrace: captured cheaply as return addresses on the training
// thread, symbolized (function, file, line, library) once per unique address on the writer thread,
// before the frame's first use is written, so the trace reads on another machine.
#ifndef TORCHRR_RECORDER_NATIVE_STACKS_H_
#define TORCHRR_RECORDER_NATIVE_STACKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchrr::recorder {

inline constexpr size_t kMaxNativeFrames = 64;

// Writes up to `max` return addresses of the calling thread's stack into `out`, innermost first,
// skipping `skip` frames above the caller. Returns how many. Allocation-free; thread-safe.
size_t CaptureNativeStack(uintptr_t* out, size_t max, size_t skip);

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
