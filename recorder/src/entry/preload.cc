// Recording an unchanged program: `torchrr record -o FILE -- ./trainer` preloads this library
// (LD_PRELOAD) with TORCHRR_OUTPUT set. It starts recording when the program starts, with the
// options the environment gives (torchrr_start_from_environment, as a Python program's
// sitecustomize does), and closes the trace when the program ends: through return from main or
// exit() (atexit), and through an uncaught exception (a terminate handler that first records the
// exception's message).
//
// Only the process `torchrr record` started records (TORCHRR_TARGET_PID): children the program
// spawns inherit LD_PRELOAD but not the recording.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include <cxxabi.h>

#include "session/session.h"
#include "torchrr/c_api.h"

namespace torchrr::recorder {
namespace {

constexpr int kUncaughtError = 2;  // torchrr_record_error's kind for an uncaught exception.
bool g_recording = false;  // Set once, by the constructor before main.
std::terminate_handler g_previous_terminate = nullptr;

void StopAtExit() { torchrr_stop(); }

[[noreturn]] void OnTerminate() {
  if (g_recording) {
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
    torchrr_record_error(kUncaughtError, type.c_str(), message.c_str());
    torchrr_stop();
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

__attribute__((constructor)) void StartFromEnvironment() {
  const char* target = std::getenv("TORCHRR_TARGET_PID");
  if (target != nullptr && *target != '\0' && std::atol(target) != static_cast<long>(getpid())) {
    return;
  }
  if (torchrr_start_from_environment() != 0) return;  // Unset TORCHRR_OUTPUT, or it said why.
  g_recording = true;
  std::atexit(StopAtExit);
  g_previous_terminate = std::set_terminate(OnTerminate);
}

}  // namespace

// Called for every C++ exception thrown in the process: one thrown inside a recorded op (the
// autograd engine's "modified by an inplace operation" among them) is recorded with its message
// before it propagates, so the replay can quote it even when the program catches it.
void NoteThrow(void* thrown, std::type_info* type) {
  if (!g_recording || !Session::ThreadInsideRecordedOp()) return;
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
