// The process-wide state of the recording: the one active session, which the RecordFunction
// callbacks' trampolines feed, and what a forked child inherits of it (fork following). Session
// (session.h) starts and stops through it; nothing else touches it.
#ifndef TORCHRR_RECORDER_ACTIVE_SESSION_H_
#define TORCHRR_RECORDER_ACTIVE_SESSION_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/record_function.h>

#include "session/session.h"

namespace torchrr::recorder {

// Guards the active session and the fork state below. A forked child takes it afterwards
// (Active(), Start()): the forking thread holds it across fork() (BeforeFork).
extern std::mutex g_active_mu;
extern std::shared_ptr<Session> g_active;  // Guarded by g_active_mu.
extern std::atomic<Session*> g_active_raw;  // The callbacks' fast path.
// In a forked child of a recording process: the callbacks the parent registered, still
// registered here, which the child's next session takes over instead of registering its own
// (which would record every op twice, and take torch's lock on its callbacks, which a thread the
// child does not have may have held at the fork). Guarded by g_active_mu.
extern at::CallbackHandle g_inherited_callback;
// In a forked child of a session that follows forks (RecorderOptions::follow_forks): the session
// it inherited, whose options the child's recording takes, until the child's first op starts that
// recording (or it is stopped first). Guarded by g_active_mu; the flag is the callbacks' fast path.
extern Session* g_fork_parent;
extern std::atomic<bool> g_fork_pending;

// The RecordFunction callbacks: they hand each op to the active session, or to none.
std::unique_ptr<at::ObserverContext> StartTrampoline(const at::RecordFunction& fn);
void EndTrampoline(const at::RecordFunction& fn, at::ObserverContext* ctx);

// pthread_atfork's handlers in the parent (Session::AfterForkInChild is the child's).
void BeforeFork();
void AfterForkInParent();

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_ACTIVE_SESSION_H_
