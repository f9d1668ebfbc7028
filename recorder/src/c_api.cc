#include "torchrr/c_api.h"

#include <pthread.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "environment_options.h"
#include "session.h"

namespace {

std::mutex g_mu;
std::shared_ptr<torchrr::recorder::Session>* g_session = nullptr;  // Guarded by g_mu.

// A forked child stops its recording through torchrr_stop (at exit), which takes g_mu: the
// forking thread holds it across fork(), so that the child never finds it held by a thread it
// does not have. Registered after the session's own handlers, so that g_mu is taken before the
// session's lock, in the order Start() takes them.
void LockBeforeFork() { g_mu.lock(); }
void UnlockAfterFork() { g_mu.unlock(); }

// Starts the C API's one recording. Returns torchrr_start's values.
int Start(const torchrr::RecorderOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_session != nullptr && *g_session && (*g_session)->recording()) {
    std::fprintf(stderr, "torchrr: warning: not recording %s: already recording\n",
                 options.path.c_str());
    return 1;
  }
  std::string error;
  auto session = torchrr::recorder::Session::Start(options, &error);
  if (!session) {
    std::fprintf(stderr, "torchrr: warning: not recording: %s\n", error.c_str());
    return 1;
  }
  static const bool fork_handlers =
      pthread_atfork(&LockBeforeFork, &UnlockAfterFork, &UnlockAfterFork) == 0;
  (void)fork_handlers;  // Without them (ENOMEM), as before: a child may find g_mu held.
  if (g_session == nullptr) g_session = new std::shared_ptr<torchrr::recorder::Session>();
  *g_session = std::move(session);
  return 0;
}

}  // namespace

extern "C" int torchrr_start(const char* path, int native_stacks, int python_stacks,
                             size_t max_buffered_bytes, int drop_when_full, int rank,
                             uint32_t flags) {
  return torchrr_start_keeping(path, native_stacks, python_stacks, max_buffered_bytes,
                               drop_when_full, rank, flags, 0, 0, 1, 0, nullptr);
}

extern "C" void torchrr_step(void) {
  if (auto session = torchrr::recorder::Session::Active()) session->MarkStep();
}

extern "C" int torchrr_start_keeping(const char* path, int native_stacks, int python_stacks,
                                     size_t max_buffered_bytes, int drop_when_full, int rank,
                                     uint32_t flags, size_t keep_last_steps,
                                     size_t keep_last_bytes, uint64_t steps_first,
                                     uint64_t steps_last, const char* spill_dir) {
  torchrr::RecorderOptions options;
  options.path = path != nullptr ? path : "torchrr.trr";
  options.native_stacks = native_stacks != 0;
  options.python_stacks = python_stacks != 0;
  if (max_buffered_bytes != 0) options.max_buffered_bytes = max_buffered_bytes;
  options.when_full = drop_when_full ? torchrr::WhenFull::kDrop : torchrr::WhenFull::kWait;
  options.rank = rank;
  options.verify_saved = (flags & TORCHRR_VERIFY_SAVED) != 0;
  options.cuda_kernels = (flags & TORCHRR_NO_CUDA_KERNELS) == 0;
  options.all_ops = (flags & TORCHRR_ALL_OPS) != 0;
  options.follow_forks = (flags & TORCHRR_FOLLOW_FORKS) != 0;
  options.source = (flags & TORCHRR_NO_SOURCE) == 0;
  options.keep_last_steps = keep_last_steps;
  if (keep_last_bytes != 0) options.keep_last_bytes = keep_last_bytes;
  options.steps_first = steps_first;
  options.steps_last = steps_last;
  if (spill_dir != nullptr) options.spill_dir = spill_dir;
  return Start(options);
}

extern "C" int torchrr_start_from_environment(void) {
  std::optional<torchrr::RecorderOptions> options =
      torchrr::recorder::OptionsFromEnvironment();
  return options ? Start(*options) : 1;
}

extern "C" int torchrr_stop(void) {
  std::shared_ptr<torchrr::recorder::Session> session;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_session == nullptr || !*g_session) return 1;
    session = std::move(*g_session);
  }
  session->Stop();
  return 0;
}

extern "C" int torchrr_recording(void) {
  auto session = torchrr::recorder::Session::Active();
  return session && session->recording() ? 1 : 0;
}

extern "C" void torchrr_record_error(int kind, const char* type, const char* message) {
  auto session = torchrr::recorder::Session::Active();
  if (!session) return;
  auto error_kind = kind == 1   ? torchrr::format::ErrorKind::kPythonException
                    : kind == 2 ? torchrr::format::ErrorKind::kUncaught
                                : torchrr::format::ErrorKind::kCppException;
  session->RecordError(error_kind, type ? type : "", message ? message : "");
}

extern "C" uint64_t torchrr_ops_recorded(void) {
  auto session = torchrr::recorder::Session::Active();
  return session ? session->ops_recorded() : 0;
}

extern "C" const char* torchrr_python_stack_walker(void) {
  return torchrr::recorder::PythonStackWalkerName();
}
