// libunwind's unw_backtrace(), loaded at run time: the fast way to take a C++ stack.
//
// libgcc's unwinder (which Boost.Stacktrace's capture uses) looks up and interprets the DWARF
// unwind rules of every frame on every capture. libunwind's unw_backtrace() keeps a per-thread
// cache of each return address's frame layout, so a stack it has seen before costs a few memory
// reads per frame; a frame it cannot handle that way sends it down its own full unwinder. The
// training step repeats the same call sites every step, which is the case the cache is for.
//
// libunwind is dlopen()ed with RTLD_LOCAL, never linked: it also defines _Unwind_Backtrace,
// _Unwind_RaiseException and backtrace(), and the program's exceptions must keep libgcc's. This
// file is the only one that talks to libunwind.
#ifndef TORCHRR_RECORDER_LIBUNWIND_BACKTRACE_H_
#define TORCHRR_RECORDER_LIBUNWIND_BACKTRACE_H_

namespace torchrr::recorder {

// unw_backtrace(buffer, size): writes up to `size` instruction pointers of the calling thread's
// stack, innermost first, starting inside libunwind itself; returns how many.
using UnwBacktraceFn = int (*)(void** buffer, int size);

// The loaded unw_backtrace, or nullptr when libunwind.so.8 is not installed or does not export it.
// Loads once per process; thread-safe.
UnwBacktraceFn LibunwindBacktrace();

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_LIBUNWIND_BACKTRACE_H_
