#include "session/active_session.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "capture/op_filter.h"
#include "internals/torch_internals.h"
#include "session/thread_state.h"

namespace torchrr::recorder {
namespace {

// An op the recorder does not record: its outputs need not be collected. The dispatcher reads the
// flag after the start callbacks, before it calls the kernel.
std::unique_ptr<at::ObserverContext> Unrecorded(const at::RecordFunction& fn) {
  SkipOutputsIfOnlyCallback(fn);
  return nullptr;
}

// FILE.pidN.EXT for `path` = FILE.EXT (EXT .trr when it has none).
std::string ForkedChildTracePath(const std::string& path, pid_t pid) {
  std::filesystem::path p(path);
  std::string extension = p.extension().string();
  if (extension.empty()) extension = ".trr";
  p.replace_extension();
  return p.string() + ".pid" + std::to_string(pid) + extension;
}

}  // namespace

std::mutex g_active_mu;
std::shared_ptr<Session> g_active;
std::atomic<Session*> g_active_raw{nullptr};
at::CallbackHandle g_inherited_callback = 0;
Session* g_fork_parent = nullptr;
std::atomic<bool> g_fork_pending{false};

std::unique_ptr<at::ObserverContext> StartTrampoline(const at::RecordFunction& fn) {
  Session* session = g_active_raw.load(std::memory_order_acquire);
  if (session == nullptr && g_fork_pending.load(std::memory_order_acquire)) {
    if (ThreadState* ts = ThisThread(); ts != nullptr && !ts->busy) {
      session = Session::StartInForkedChild(*ts);
    }
  }
  if (session == nullptr || !session->recording()) return Unrecorded(fn);
  ThreadState* ts = ThisThread();
  if (ts == nullptr || ts->busy) return Unrecorded(fn);
  // A folded op is recorded only with all_ops; its bytes are then a kernel's, mid-write.
  const bool folded = FoldedIntoTheOpAround(fn, *ts);
  if (folded && !session->records_all_ops()) return Unrecorded(fn);
  return session->OnStart(fn, *ts, folded);
}

// fork() copies the recording into the child: its tables, its locks as they were at that
// instant (held, maybe, by threads the child does not have), and its sink, whose writer thread
// stays in the parent and whose file is the parent's. The child stops that recording before it
// runs anything else and never touches any of it again, but to close its descriptor on the
// parent's trace (which would keep the file open, and locked, for as long as the child lives):
// its ops see no session, and the session is never destroyed there (that would join a thread the
// child does not have). g_active_mu is the one lock of the session's that the child takes
// afterwards (Active(), Start()): the forking thread holds it across fork(). A child of a session
// that follows forks starts a recording of its own, all new (its own tables, sink, writer thread
// and file), at its first op: a child that execs at once, or never runs an op, leaves no file.
void BeforeFork() { g_active_mu.lock(); }
void AfterForkInParent() { g_active_mu.unlock(); }

void EndTrampoline(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  OpFrame& frame = *static_cast<OpHandle&>(*ctx).frame;
  if (!frame.active) return;
  Session* session = g_active_raw.load(std::memory_order_acquire);
  ThreadState* ts = t_state;
  if (session == nullptr || ts == nullptr || ts->busy) return;
  if (frame.session != session->serial()) return;
  session->OnEnd(fn, frame, *ts);
}

bool Session::ThreadInsideRecordedOp() {
  const ThreadState* ts = t_state;
  return ts != nullptr && !ts->busy && !ts->op_stack.empty() &&
         g_active_raw.load(std::memory_order_acquire) != nullptr;
}

std::shared_ptr<Session> Session::Active() {
  std::lock_guard<std::mutex> lock(g_active_mu);
  return g_active;
}

void Session::AfterForkInChild() {
  if (g_active) {
    std::shared_ptr<Session> inherited = std::move(g_active);
    g_active_raw.store(nullptr, std::memory_order_release);
    const bool was_recording = inherited->recording_.exchange(false);
    if (inherited->sink_) inherited->sink_->CloseInheritedDescriptors();
    // Stop() marks a session stopped before it removes its callbacks: these are registered.
    if (was_recording) g_inherited_callback = inherited->callback_handle_;
    if (inherited->options_.follow_forks && was_recording) {
      // The forking thread's ops started in the parent's recording; the child's starts afresh.
      if (ThreadState* ts = t_state) ts->ForgetRunningOps();
      g_fork_parent = inherited.get();
      g_fork_pending.store(true, std::memory_order_release);
    }
    new std::shared_ptr<Session>(std::move(inherited));  // Never destroyed in the child.
  }
  g_active_mu.unlock();
}

Session* Session::StartInForkedChild(ThreadState& ts) {
  BusyGuard busy(ts);  // Opening the trace runs no op; if one ran, it would not come back here.
  std::lock_guard<std::mutex> lock(g_active_mu);
  if (g_fork_parent == nullptr) return g_active.get();  // Another thread started it, or stopped.
  Session* parent = std::exchange(g_fork_parent, nullptr);
  g_fork_pending.store(false, std::memory_order_release);
  RecorderOptions options = parent->options_;
  options.path = ForkedChildTracePath(parent->options_.path, getpid());
  // CUDA does not work in a child forked after the parent used it, and CUPTI not at all. The
  // symbolizer's locks (native_stacks.cc) may have been held by the parent's writer thread at the
  // fork: the child's writer thread must not take them.
  options.cuda_kernels = false;
  options.native_stacks = false;
  std::string error;
  std::shared_ptr<Session> child = OpenLocked(options, &error);
  if (!child) {
    std::fprintf(stderr, "torchrr: warning: forked process %ld not recorded: %s\n",
                 static_cast<long>(getpid()), error.c_str());
    return nullptr;
  }
  parent->forked_child_ = child;
  return child.get();
}

}  // namespace torchrr::recorder
