#include "session/session.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <thread>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "internals/torch_internals.h"
#include "session/active_session.h"
#include "session/file_info.h"
#include "stacks/python_stacks.h"

namespace torchrr::recorder {

using format::ObjectId;

namespace {

std::atomic<uint64_t> g_next_serial{1};  // Session::serial(); 0 is no session's.

}  // namespace

Session::Session(const RecorderOptions& options)
    : options_(options),
      pid_(getpid()),
      serial_(g_next_serial.fetch_add(1, std::memory_order_relaxed)),
      fingerprints_(options.verify_saved),
      finite_ranges_(options.check_finite),
      ids_(fingerprints_.enabled_flag()) {}

Session::~Session() { Stop(); }

std::shared_ptr<Session> Session::Start(const RecorderOptions& options, std::string* error) {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active) {
      *error = "another torchrr recorder is already recording in this process";
      return nullptr;
    }
    static const bool fork_handlers = pthread_atfork(&BeforeFork, &AfterForkInParent,
                                                     &Session::AfterForkInChild) == 0;
    (void)fork_handlers;  // Without them (ENOMEM), a forked child records into the parent's trace.
    session = OpenLocked(options, error);
    if (!session) return nullptr;
    // A recording started by the program itself wins over a forked child's own.
    g_fork_parent = nullptr;
    g_fork_pending.store(false, std::memory_order_release);
  }
  FollowCheckpointInputs(true);  // Takes the GIL: outside g_active_mu.
  FollowFunctionNodes(true);     // Likewise.
  return session;
}

std::shared_ptr<Session> Session::OpenLocked(const RecorderOptions& options, std::string* error) {
  std::shared_ptr<Session> session(new Session(options));
  ForgetPythonCodeDescriptions();  // This session's interner knows no code yet.
  // The writer thread takes pending groups each time it looks at the queue: the session outlives
  // the sink's thread (Stop closes the sink), and the sink reads the session's options.
  Session* raw = session.get();
  auto pull = [raw] { raw->PullPending(); };
  // A batch is small beside the queue's bound, so that kWait and kDrop still act per few ops.
  session->pending_bytes_ = std::clamp<size_t>(options.max_buffered_bytes / 16, 1, 64u << 10);
  session->sink_ =
      TraceSink::Open(session->options_, std::move(pull), MakeFileInfo(options), error);
  if (!session->sink_) return nullptr;
  session->interner_.emplace(*session->sink_);
  session->graph_.emplace(*session->interner_, session->ids_, session->fingerprints_);

  session->cuda_pending_ =
      session->options_.cuda_kernels && c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) &&
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() > 0;
  session->recording_.store(true, std::memory_order_release);
  g_active = session;
  g_active_raw.store(session.get(), std::memory_order_release);
  session->callback_handle_ =
      g_inherited_callback != 0
          ? std::exchange(g_inherited_callback, 0)
          : at::addGlobalCallback(
                at::RecordFunctionCallback(&StartTrampoline, &EndTrampoline)
                    .needsInputs(true)
                    .needsOutputs(true)
                    .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                             at::RecordScope::USER_SCOPE}));
  return session;
}

void Session::Stop() {
  if (getpid() != pid_) {  // A forked child: nothing here is its own.
    recording_.store(false, std::memory_order_release);
    std::shared_ptr<Session> child;
    {
      std::lock_guard<std::mutex> lock(g_active_mu);
      if (g_fork_parent == this) {  // Stopped before its first op: it never records.
        g_fork_parent = nullptr;
        g_fork_pending.store(false, std::memory_order_release);
      }
      child = forked_child_;
    }
    if (child) child->Stop();
    return;
  }
  std::call_once(stop_once_, [this] {
    const bool was_recording = recording_.exchange(false, std::memory_order_acq_rel);
    if (callback_handle_ != 0) at::removeCallback(callback_handle_);
    FollowCheckpointInputs(false);  // Takes no lock, not the GIL.
    FollowFunctionNodes(false);
    // Callbacks that were already running finish before the tables and the sink go away.
    while (in_flight_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    if (CudaActivityTracer* cuda_tracer = this->cuda_tracer()) {
      // Kernels still running have no end time yet: wait for them, unless this is the terminate
      // handler (a failed device could hang it).
      if (std::uncaught_exceptions() == 0) {
        try {
          const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
          for (c10::DeviceIndex d = 0; d < cuda->deviceCount(); ++d) cuda->synchronizeDevice(d);
        } catch (const std::exception&) {
        }
      }
      // The kernels of a run shorter than a flush period all arrive here: they belong to the
      // trace unless recording had already stopped for a failure.
      draining_cuda_.store(was_recording, std::memory_order_release);
      cuda_tracer->Stop();  // Delivers the rest through cuda_sink_, which pushes to sink_.
      cuda_tracer_.store(nullptr, std::memory_order_release);
      cuda_tracer_owner_.reset();
    }
    if (sink_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        FlushPendingLocked(/*may_wait=*/true);
      }
      sink_->Close();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.Clear();
      if (graph_) graph_->Clear();
    }
    if (callback_handle_ == 0) return;  // Never started (Start() failed, holding g_active_mu).
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active.get() == this) {
      g_active_raw.store(nullptr, std::memory_order_release);
      g_active.reset();  // The caller still holds a reference; this is not the last one.
    }
  });
}

void Session::Degrade(const std::string& why, const ThreadState& ts) {
  if (!recording_.exchange(false)) return;
  std::fprintf(stderr,
               "torchrr: warning: recording stopped: %s; the run goes on without recording\n",
               why.c_str());
  // The trace says so too, where it stopped and why: the replayer must not read what follows as
  // a run with nothing to report.
  try {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetInterned();  // The failed op's group, with what it defined, never reached the sink.
    EncodedRecords group;
    format::ErrorRecord stop;
    stop.kind = format::ErrorKind::kRecorder;
    stop.op = ts.op_stack.empty() ? 0 : ts.op_stack.back();
    stop.thread = static_cast<uint32_t>(at::RecordFunction::currentThreadId());
    stop.time_ns = NowNs();
    stop.type = interner_->String("recording_stopped", group);
    stop.message = why;
    group.Add(stop);
    PushGroupLocked(group);
  } catch (const std::exception&) {
    // Out of memory: the trace ends without saying why; the warning above did.
  }
}

void Session::PushGroupLocked(EncodedRecords& group) {
  pending_.AddAll(group);
  group.clear();
  if (pending_.bytes().size() >= pending_bytes_) FlushPendingLocked(/*may_wait=*/true);
}

void Session::FlushPendingLocked(bool may_wait) {
  if (pending_.empty()) return;
  TraceSink::PushResult result = sink_->Push(pending_, may_wait);
  pending_.clear();
  switch (result) {
    case TraceSink::PushResult::kQueued:
      break;
    case TraceSink::PushResult::kDropped:
      ForgetInterned();
      break;
    case TraceSink::PushResult::kFailed:
      recording_.store(false, std::memory_order_release);  // The sink already warned.
      break;
  }
}

void Session::PullPending() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) FlushPendingLocked(/*may_wait=*/false);
}

void Session::ForgetInterned() {
  interner_->Forget();
  ids_.ForgetMetadata();
}

template <class Fill>
void Session::PushFromProgram(Fill&& fill) {
  ThreadState* ts = ThisThread();
  if (!recording() || ts == nullptr) return;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(*ts);
  EncodedRecords group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fill(*ts, group);
    PushGroupLocked(group);
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

void Session::RecordError(format::ErrorKind kind, const std::string& type,
                          const std::string& message) {
  PushFromProgram([&](ThreadState& ts, EncodedRecords& group) {
    format::ErrorRecord error;
    error.kind = kind;
    error.op = ts.op_stack.empty() ? 0 : ts.op_stack.back();
    error.thread = static_cast<uint32_t>(at::RecordFunction::currentThreadId());
    error.time_ns = NowNs();
    error.type = interner_->String(type, group);
    error.message = message;
    group.Add(error);
  });
}

bool Session::Flush() {
  ThreadState* ts = ThisThread();
  if (!recording() || ts == nullptr) return false;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  bool flushed = false;
  {
    BusyGuard busy(*ts);
    {
      std::lock_guard<std::mutex> lock(mu_);
      FlushPendingLocked(/*may_wait=*/true);
    }
    flushed = recording() && sink_->Flush();
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  return flushed;
}

void Session::MarkStep() {
  finite_ranges_.ForgetKnown();
  PushFromProgram([](ThreadState&, EncodedRecords& group) {
    format::StepRecord mark;
    mark.time_ns = NowNs();
    mark.marked = true;
    group.Add(mark);
  });
}

}  // namespace torchrr::recorder
