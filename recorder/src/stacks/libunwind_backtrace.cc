#include "stacks/libunwind_backtrace.h"

#include <dlfcn.h>

namespace torchrr::recorder {

UnwBacktraceFn LibunwindBacktrace() {
  static const UnwBacktraceFn fn = [] {
    // The library stays loaded for the life of the process: threads may be inside it at exit.
    void* library = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return UnwBacktraceFn{nullptr};
    return reinterpret_cast<UnwBacktraceFn>(dlsym(library, "unw_backtrace"));
  }();
  return fn;
}

}  // namespace torchrr::recorder
