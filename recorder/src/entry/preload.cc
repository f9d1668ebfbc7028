// Recording an unchanged program: `torchrr record -o FILE -- ./trainer` preloads this library
// (LD_PRELOAD) with TORCHRR_OUTPUT set. It starts recording when the program starts, with the
// options the environment gives (torchrr_start_from_environment, as a Python program's
// sitecustomize does), and closes the trace when the program ends: through return from main or
// exit() (atexit), and through an uncaught exception (a terminate handler that first records the
// exception's message), and through _exit and the exec functions, which skip atexit: each closes
// the trace first, and an exec under `torchrr record` lets the new image record into
// FILE.execN.trr, as a Python program's os._exit and os.exec* do (_recording.py).
//
// Only the process `torchrr record` started records (TORCHRR_TARGET_PID): children the program
// spawns inherit LD_PRELOAD but not the recording.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include <cxxabi.h>

#include "session/session.h"
#include "session/thread_state.h"
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

// The real function `name` that this library's definition of it hides.
template <typename Function>
Function Next(const char* name) {
  return reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
}

// Closes this process's recording before its image ends without atexit (_exit, an exec): the
// trace would otherwise keep only what the writer thread had written, none of a short program.
// True when a recording was closed. Nothing when the calling thread is inside torchrr's own code
// (a signal handler that interrupted it and calls _exit): its locks may be held by that very
// thread, and the trace then ends as a kill leaves it, at its last flush.
bool CloseBeforeImageEnds() {
  if (!g_recording || torchrr_recording() == 0) return false;
  if (const ThreadState* ts = t_state; ts != nullptr && ts->busy) {
    // write(2), not stdio: this may be a signal handler.
    static constexpr char kWarning[] =
        "torchrr: warning: the program ended inside the recorder (a signal handler?): the trace "
        "ends at its last flush\n";
    (void)!::write(STDERR_FILENO, kWarning, sizeof(kWarning) - 1);
    return false;
  }
  return torchrr_stop() == 0;
}

// The environment changes that let an exec's new image record under `torchrr record`: as
// _recording.py's _exec_trace_changes, FILE.execN.EXT beside FILE.EXT (N counting the execs), and
// without the variables that say a process already records. Made once, by the exec that closed
// the recording, and applied by every exec after it (one that failed is followed by another).
struct ExecChanges {
  std::vector<std::pair<std::string, std::string>> set;
  std::vector<std::string> removed = {"TORCHRR_RECORDER_PID", "TORCHRR_RECORDER_RANK"};
};
std::mutex g_exec_mu;
ExecChanges* g_exec_changes = nullptr;  // Guarded by g_exec_mu; never freed (an exec follows).

// The value of `name` in the environment `env` (a NULL-ended array), or nullptr.
const char* Find(char* const* env, std::string_view name) {
  for (char* const* e = env; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
      return *e + name.size() + 1;
    }
  }
  return nullptr;
}

void MakeExecChanges(char* const* env) {
  const char* output = Find(env, "TORCHRR_OUTPUT");
  if (output == nullptr || *output == '\0') return;  // torchrr_start(), not `torchrr record`.
  const char* given_base = Find(env, "TORCHRR_EXEC_BASE");
  const std::string base = given_base != nullptr && *given_base != '\0' ? given_base : output;
  const char* given_count = Find(env, "TORCHRR_EXEC_COUNT");
  const long count = (given_count != nullptr ? std::atol(given_count) : 0) + 1;
  // The extension: after the last dot of the last path component, unless the name starts with it.
  const size_t slash = base.rfind('/');
  const size_t name_at = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = base.rfind('.');
  if (dot == std::string::npos || dot <= name_at) dot = base.size();
  const std::string extension = dot < base.size() ? base.substr(dot) : ".trr";
  auto* changes = new ExecChanges();
  changes->set = {{"TORCHRR_EXEC_BASE", base},
                  {"TORCHRR_EXEC_COUNT", std::to_string(count)},
                  {"TORCHRR_OUTPUT", base.substr(0, dot) + ".exec" + std::to_string(count) +
                                         extension}};
  g_exec_changes = changes;
}

// Before an exec: closes the recording (the changes are made from `env`, the environment the
// new image gets) and returns whether the new image's environment is to be changed.
bool PrepareExec(char* const* env) {
  const bool closed = CloseBeforeImageEnds();
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (closed && g_exec_changes == nullptr) MakeExecChanges(env);
  return g_exec_changes != nullptr;
}

// `env` with the exec changes applied, into *storage (the strings) and the returned array.
std::vector<char*> ChangedEnvironment(char* const* env, std::vector<std::string>* storage) {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  auto changed = [](std::string_view entry) {
    const std::string_view name = entry.substr(0, entry.find('='));
    for (const auto& [set, value] : g_exec_changes->set) {
      if (name == set) return true;
    }
    for (const std::string& removed : g_exec_changes->removed) {
      if (name == removed) return true;
    }
    return false;
  };
  for (char* const* e = env; e != nullptr && *e != nullptr; ++e) {
    if (!changed(*e)) storage->emplace_back(*e);
  }
  for (const auto& [name, value] : g_exec_changes->set) storage->push_back(name + "=" + value);
  std::vector<char*> array;
  for (std::string& entry : *storage) array.push_back(entry.data());
  array.push_back(nullptr);
  return array;
}

// An exec function that takes the new image's environment, `Target` naming the program.
template <typename Target>
using ExecWith = int (*)(Target, char* const*, char* const*);

// `real`(target, argv, envp), the recording closed first and envp changed as PrepareExec says.
template <typename Target>
int ExecChanged(ExecWith<Target> real, Target target, char* const argv[], char* const envp[]) {
  if (!PrepareExec(envp)) return real(target, argv, envp);
  std::vector<std::string> storage;
  return real(target, argv, ChangedEnvironment(envp, &storage).data());
}

// The same changes made to this process's own environment, which execv and execvp pass on.
void ChangeOwnEnvironment() {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  for (const auto& [name, value] : g_exec_changes->set) setenv(name.c_str(), value.c_str(), 1);
  for (const std::string& name : g_exec_changes->removed) unsetenv(name.c_str());
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

// The ends of an image that skip atexit. Each hands its arguments on unchanged; a recording that
// could not be closed costs the trace its last ops, never the call.
extern "C" {

[[noreturn]] void _exit(int status) {
  static auto real = torchrr::recorder::Next<void (*)(int)>("_exit");
  torchrr::recorder::CloseBeforeImageEnds();
  real(status);
  __builtin_unreachable();
}

[[noreturn]] void _Exit(int status) {
  static auto real = torchrr::recorder::Next<void (*)(int)>("_Exit");
  torchrr::recorder::CloseBeforeImageEnds();
  real(status);
  __builtin_unreachable();
}

int execve(const char* path, char* const argv[], char* const envp[]) {
  static auto real = torchrr::recorder::Next<torchrr::recorder::ExecWith<const char*>>("execve");
  return torchrr::recorder::ExecChanged(real, path, argv, envp);
}

int execvpe(const char* file, char* const argv[], char* const envp[]) {
  static auto real = torchrr::recorder::Next<torchrr::recorder::ExecWith<const char*>>("execvpe");
  return torchrr::recorder::ExecChanged(real, file, argv, envp);
}

int fexecve(int fd, char* const argv[], char* const envp[]) {
  static auto real = torchrr::recorder::Next<torchrr::recorder::ExecWith<int>>("fexecve");
  return torchrr::recorder::ExecChanged(real, fd, argv, envp);
}

int execv(const char* path, char* const argv[]) {
  static auto real = torchrr::recorder::Next<int (*)(const char*, char* const*)>("execv");
  if (torchrr::recorder::PrepareExec(environ)) torchrr::recorder::ChangeOwnEnvironment();
  return real(path, argv);
}

int execvp(const char* file, char* const argv[]) {
  static auto real = torchrr::recorder::Next<int (*)(const char*, char* const*)>("execvp");
  if (torchrr::recorder::PrepareExec(environ)) torchrr::recorder::ChangeOwnEnvironment();
  return real(file, argv);
}

}  // extern "C"
