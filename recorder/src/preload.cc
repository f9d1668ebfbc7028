// Recording an unchanged program: `torchrr record -o FILE -- ./trainer` preloads this library
// (LD_PRELOAD) with TORCHRR_OUTPUT set. It starts a Recorder when the program starts, and closes
// the trace when the program ends: through return from main or exit() (atexit), and through an
// uncaught exception (a terminate handler that first records the exception's message).
//
// Only the process `torchrr record` started records (TORCHRR_TARGET_PID): children the program
// spawns inherit LD_PRELOAD but not the recording.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <typeinfo>

#include <cxxabi.h>

#include "session.h"

namespace torchrr::recorder {
namespace {

std::shared_ptr<Session>* g_preload_session = nullptr;  // Leaked on purpose: lives to exit.
std::terminate_handler g_previous_terminate = nullptr;

void StopAtExit() {
  if (g_preload_session && *g_preload_session) (*g_preload_session)->Stop();
}

[[noreturn]] void OnTerminate() {
  if (g_preload_session && *g_preload_session) {
    std::string type = "std::terminate";
    std::string message = "terminate called without an active exception";
    if (std::exception_ptr current = std::current_exception()) {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        type = "uncaught exception";
        message = e.what();
      } catch (...) {
        type = "uncaught exception";
        message = "an exception not derived from std::exception";
      }
    }
    (*g_preload_session)->RecordError(format::ErrorKind::kUncaught, type, message);
    (*g_preload_session)->Stop();
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

bool ParseBool(const char* value, bool fallback) {
  if (value == nullptr || *value == '\0') return fallback;
  std::string v = value;
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}

__attribute__((constructor)) void StartFromEnvironment() {
  const char* output = std::getenv("TORCHRR_OUTPUT");
  if (output == nullptr || *output == '\0') return;
  const char* target = std::getenv("TORCHRR_TARGET_PID");
  if (target != nullptr && *target != '\0' && std::atol(target) != static_cast<long>(getpid())) {
    return;
  }
  RecorderOptions options;
  options.path = output;
  options.native_stacks = ParseBool(std::getenv("TORCHRR_NATIVE_STACKS"), true);
  options.verify_saved = ParseBool(std::getenv("TORCHRR_VERIFY_SAVED"), false);
  options.cuda_kernels = ParseBool(std::getenv("TORCHRR_CUDA_KERNELS"), true);
  options.all_ops = ParseBool(std::getenv("TORCHRR_ALL_OPS"), false);
  if (const char* bytes = std::getenv("TORCHRR_MAX_BUFFERED_BYTES")) {
    options.max_buffered_bytes = std::strtoull(bytes, nullptr, 10);
  }
  if (const char* full = std::getenv("TORCHRR_WHEN_FULL")) {
    options.when_full = std::string(full) == "drop" ? WhenFull::kDrop : WhenFull::kWait;
  }
  std::string error;
  auto session = Session::Start(options, &error);
  if (!session) {
    std::fprintf(stderr, "torchrr: warning: not recording: %s\n", error.c_str());
    return;
  }
  g_preload_session = new std::shared_ptr<Session>(std::move(session));
  std::atexit(StopAtExit);
  g_previous_terminate = std::set_terminate(OnTerminate);
}

}  // namespace

// Called for every C++ exception thrown in the process: one thrown inside a recorded op (the
// autograd engine's "modified by an inplace operation" among them) is recorded with its message
// before it propagates, so the replay can quote it even when the program catches it.
void NoteThrow(void* thrown, std::type_info* type) {
  if (g_preload_session == nullptr || !Session::ThreadInsideRecordedOp()) return;
  void* object = thrown;
  if (!typeid(std::exception).__do_catch(type, &object, 1)) return;
  const auto* exception = static_cast<const std::exception*>(object);
  if (auto session = Session::Active()) {
    session->RecordError(format::ErrorKind::kCppException, type->name(), exception->what());
  }
}

}  // namespace torchrr::recorder

// Interposes the C++ runtime's throw (this library is preloaded, so it comes first), notes the
// exception and hands it on unchanged.
namespace __cxxabiv1 {
extern "C" void __cxa_throw(void* thrown, std::type_info* type,
                            void(_GLIBCXX_CDTOR_CALLABI* destructor)(void*)) {
  using Throw = void (*)(void*, std::type_info*, void (*)(void*));
  static Throw real = reinterpret_cast<Throw>(dlsym(RTLD_NEXT, "__cxa_throw"));
  torchrr::recorder::NoteThrow(thrown, type);
  real(thrown, type, destructor);
  __builtin_unreachable();
}
}  // namespace __cxxabiv1
