#include "session/session.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "stacks/native_stacks.h"
#include "capture/op_arguments.h"
#include "capture/op_filter.h"
#include "stacks/python_stacks.h"
#include "capture/saved_variables.h"
#include "internals/torch_internals.h"

#ifndef TORCHRR_VERSION
#define TORCHRR_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_VERSION
#define TORCHRR_TORCH_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_CUDA_VERSION
#define TORCHRR_TORCH_CUDA_VERSION ""
#endif

namespace torchrr::recorder {

using format::ObjectId;

namespace {

std::mutex g_active_mu;
std::shared_ptr<Session> g_active;            // Guarded by g_active_mu.
std::atomic<Session*> g_active_raw{nullptr};  // The callbacks' fast path.

// An op the recorder does not record: its outputs need not be collected. The dispatcher reads the
// flag after the start callbacks, before it calls the kernel.
std::unique_ptr<at::ObserverContext> Unrecorded(const at::RecordFunction& fn) {
  SkipOutputsIfOnlyCallback(fn);
  return nullptr;
}

std::atomic<uint64_t> g_next_serial{1};  // Session::serial(); 0 is no session's.

// In a forked child of a recording process: the callbacks the parent registered, still
// registered here, which the child's next session takes over instead of registering its own
// (which would record every op twice, and take torch's lock on its callbacks, which a thread the
// child does not have may have held at the fork). Guarded by g_active_mu.
at::CallbackHandle g_inherited_callback = 0;
// In a forked child of a session that follows forks (RecorderOptions::follow_forks): the session
// it inherited, whose options the child's recording takes, until the child's first op starts that
// recording (or it is stopped first). Guarded by g_active_mu; the flag is the callbacks' fast path.
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
  if (!session->records_all_ops() && FoldedIntoTheOpAround(fn, *ts)) return Unrecorded(fn);
  return session->OnStart(fn, *ts);
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

// FILE.pidN.EXT for `path` = FILE.EXT (EXT .trr when it has none).
std::string ForkedChildTracePath(const std::string& path, pid_t pid) {
  std::filesystem::path p(path);
  std::string extension = p.extension().string();
  if (extension.empty()) extension = ".trr";
  p.replace_extension();
  return p.string() + ".pid" + std::to_string(pid) + extension;
}

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

std::vector<std::string> ReadCommandLine() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

format::FileInfo MakeFileInfo(const RecorderOptions& options) {
  format::FileInfo info;
  info.torchrr_version = TORCHRR_VERSION;
  info.torch_version = TORCHRR_TORCH_VERSION;
  info.cuda_version = TORCHRR_TORCH_CUDA_VERSION;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.host = host;
  info.pid = getpid();
  info.rank = options.rank >= 0 ? options.rank : EnvInt("RANK", -1);
  info.world_size = EnvInt("WORLD_SIZE", 0);
  info.start_time_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  info.command_line = ReadCommandLine();
  return info;
}

}  // namespace

// Receives CUPTI's records on CUPTI's thread (or the one in Flush/Stop), one buffer at a time,
// never concurrently: interns kernel names and pushes each buffer's records as one group.
class Session::CudaSink : public CudaActivityTracer::Sink {
 public:
  explicit CudaSink(Session* session) : session_(session) {}

  void OnKernel(const format::CudaKernelRecord& record, std::string_view name) override {
    if (record.op == kOwnCudaWork) return;
    format::CudaKernelRecord r = record;
    {
      std::lock_guard<std::mutex> lock(session_->mu_);
      r.name = session_->interner_->String(name, group_);
    }
    group_.Add(r);
  }
  void OnMemcpy(const format::CudaMemcpyRecord& record) override {
    if (record.op != kOwnCudaWork) group_.Add(record);
  }
  void OnDataLoss(uint64_t records, std::string_view reason) override {
    int64_t now = NowNs();
    group_.Add(format::DataLossRecord{records, 0, now, now, std::string(reason)});
  }
  void OnDeliveryEnd() override {
    if (!group_.empty() && session_->recording()) {
      std::lock_guard<std::mutex> lock(session_->mu_);
      session_->PushGroupLocked(group_);
    }
    group_.clear();
  }

 private:
  Session* session_;
  EncodedRecords group_;  // CUPTI delivery only.
};

Session::Session(const RecorderOptions& options)
    : options_(options),
      pid_(getpid()),
      serial_(g_next_serial.fetch_add(1, std::memory_order_relaxed)),
      fingerprints_(options.verify_saved),
      ids_(fingerprints_.enabled_flag()) {}

void Session::StartCudaTracer() {
  if (!options_.cuda_kernels || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ||
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() <= 0) {
    return;  // No CUDA device: nothing to trace, and nothing to warn about.
  }
  CuptiApi api;
  std::string why_not;
  cuda_sink_ = std::make_unique<CudaSink>(this);
  if (LoadCupti(&api, &why_not)) {
    cuda_tracer_ = CudaActivityTracer::Start(api, cuda_sink_.get(), &NowNs, &why_not);
  }
  if (!cuda_tracer_) {
    std::fprintf(stderr, "torchrr: warning: CUDA kernels not recorded: %s\n", why_not.c_str());
  }
}

// CUPTI hands over full buffers on its own; a flush about once a second keeps a crashed run's
// trace close to complete. One thread flushes, outside every lock (delivery takes mu_).
void Session::MaybeFlushCuda() {
  int64_t now = NowNs();
  int64_t last = last_cuda_flush_ns_.load(std::memory_order_relaxed);
  if (now - last < 1'000'000'000) return;
  if (!last_cuda_flush_ns_.compare_exchange_strong(last, now)) return;
  cuda_tracer_->Flush();
}

Session::~Session() { Stop(); }

bool Session::ThreadInsideRecordedOp() {
  const ThreadState* ts = t_state;
  return ts != nullptr && !ts->busy && !ts->op_stack.empty() &&
         g_active_raw.load(std::memory_order_acquire) != nullptr;
}

std::shared_ptr<Session> Session::Active() {
  std::lock_guard<std::mutex> lock(g_active_mu);
  return g_active;
}

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

  session->StartCudaTracer();
  session->last_cuda_flush_ns_.store(NowNs(), std::memory_order_relaxed);
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
    recording_.store(false, std::memory_order_release);
    if (callback_handle_ != 0) at::removeCallback(callback_handle_);
    FollowCheckpointInputs(false);  // Takes no lock, not the GIL.
    FollowFunctionNodes(false);
    // Callbacks that were already running finish before the tables and the sink go away.
    while (in_flight_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    if (cuda_tracer_) {
      // Kernels still running have no end time yet: wait for them, unless this is the terminate
      // handler (a failed device could hang it).
      if (std::uncaught_exceptions() == 0) {
        try {
          const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
          for (c10::DeviceIndex d = 0; d < cuda->deviceCount(); ++d) cuda->synchronizeDevice(d);
        } catch (const std::exception&) {
        }
      }
      cuda_tracer_->Stop();  // Delivers the rest through cuda_sink_, which pushes to sink_.
      cuda_tracer_.reset();
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

void Session::MarkStep() {
  PushFromProgram([](ThreadState&, EncodedRecords& group) {
    format::StepRecord mark;
    mark.time_ns = NowNs();
    mark.marked = true;
    group.Add(mark);
  });
}

format::ObjectId Session::RecordDeferredWrapper(ThreadState& ts, EncodedRecords& out) {
  // Every deferred wrapper on the stack not yet recorded, outermost first (a backward run inside
  // a hook nests one in another): each is an op 0 on the stack, in the order of deferred_wrappers.
  ObjectId parent = 0;
  size_t next = 0;
  for (ObjectId& id : ts.op_stack) {
    if (id == 0) {
      while (next < ts.deferred_wrappers.size() && ts.deferred_wrappers[next]->op.op != 0) ++next;
      if (next == ts.deferred_wrappers.size()) return 0;  // Not a deferred wrapper's: unknown.
      OpFrame& wrapper = *ts.deferred_wrappers[next++];
      wrapper.op.op = ids_.NewId();
      wrapper.op.name = interner_->String(wrapper.deferred_name, out);
      wrapper.op.parent = parent;
      id = wrapper.op.op;
    }
    parent = id;
  }
  return parent;
}


// The stack an op gets, captured before mu_ is taken.
struct Session::CapturedStack {
  uintptr_t pcs[kMaxNativeFrames];
  size_t n_pcs = 0;
  size_t n_py = 0;  // In ThreadState::python_frames (not cleared per op: n_py says how many).
  std::vector<PythonCode> new_codes;
};

bool Session::BeginOp(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame) {
  format::OpRecord& op = frame.op;
  op.start_ns = NowNs();
  frame.uncaught_at_start = std::uncaught_exceptions();
  frame.sequence_at_start = at::sequence_number::peek();
  if (ts.op_stack.empty()) ts.outermost_sequence_at_start = frame.sequence_at_start;
  frame.thread = at::RecordFunction::currentThreadId();
  op.thread = static_cast<uint32_t>(fn.threadId());
  op.scope = ScopeOf(fn.scope());
  op.sequence_nr = fn.seqNr();
  op.forward_thread = fn.forwardThreadId();
  op.grad_mode = at::GradMode::is_enabled();
  op.parent = ts.op_stack.empty() ? 0 : ts.op_stack.back();
  // Stacks for top-level ops outside backward: nested ops share their top-level op's stack,
  // and ops run by autograd's engine have no user frames. An op inside record_function() ranges
  // only (torch.optim's step, a user's profiler range) is one the user called: it gets a stack
  // too. So is an op directly inside the engine's wrapper around a node (a tensor or node hook's),
  // while the wrapper, autograd's own, has none. And one directly inside a torch.compile'd
  // region being run ("Torch-Compiled Region: 0/0", a range around the compiled frame, which
  // has the user's line that called it): the compiled graph's ops, whose frames in the graph's
  // generated code name the user's lines they were traced from, and the ops of another region's
  // compilation after a graph break, run on the graph's nodes with their lines too.
  const bool is_backward = op.scope == format::OpScope::kBackwardFunction;
  const bool outermost = ts.op_stack.size() == ts.transparent_scopes;
  const bool engine_wrapper = outermost && IsEngineWrapper(fn, op.scope, op.sequence_nr);
  frame.transparent = op.scope == format::OpScope::kUserScope || engine_wrapper ||
                      (outermost && IsCompiledRegion(fn.name()));
  // An engine wrapper around only its node's backward function says nothing that function's
  // record does not: it is recorded when another op runs in it (RecordDeferredWrapper).
  if (engine_wrapper && !records_all_ops()) Defer(fn, ts, frame);
  // Directly inside a backward function with grad mode on: the user's forward code run again by
  // activation checkpointing's recomputation (or a create_graph formula): its lines are the
  // user's.
  const bool recomputed = !is_backward && op.grad_mode && ts.backward_depth > 0 &&
                          !ts.op_scopes.empty() &&
                          ts.op_scopes.back() == format::OpScope::kBackwardFunction;
  return (outermost && !is_backward && !engine_wrapper) || recomputed;
}

void Session::Defer(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame) {
  frame.deferred = true;
  frame.deferred_name = fn.name();
  ts.deferred_wrappers.push_back(&frame);
  ts.op_stack.push_back(0);
  ts.op_scopes.push_back(frame.op.scope);
  ++ts.transparent_scopes;
  frame.active = true;
}

void Session::CaptureStack(ThreadState& ts, bool wants_stack, CapturedStack& stack) {
  if (!wants_stack) return;
  if (options_.native_stacks && ts.backward_depth == 0) {
    stack.n_pcs = CaptureNativeStack(stack.pcs, kMaxNativeFrames, 3);
  }
  if (options_.python_stacks) {  // No lock held.
    stack.n_py = CapturePythonStack(ts.python_frames.data(), kMaxPythonFrames, &stack.new_codes);
  }
}

void Session::StartLocked(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame,
                          CapturedStack& stack) {
  format::OpRecord& op = frame.op;
  const bool is_backward = op.scope == format::OpScope::kBackwardFunction;
  interner_->AddPythonCodes(stack.new_codes);
  if (!is_backward && op.parent == 0 && !ts.op_stack.empty() && ts.op_stack.back() == 0) {
    op.parent = RecordDeferredWrapper(ts, frame.before);
  }
  op.op = ids_.NewId();
  if (op.scope == format::OpScope::kFunction) {
    // An ATen op's name and overload point into its registered schema: stable pointers.
    op.name = interner_->OpName(fn.name(), frame.before);
    op.overload = interner_->OpName(fn.overload_name(), frame.before);
  } else {
    // OnEnd's node scratch is free between ops.
    if (is_backward) {
      frame.exec_node = graph_->ExecutingNode(fn, &op.name, ts.nodes, frame.before,
                                              &frame.exec_node_address);
    }
    // Node names and user scopes are strings the RecordFunction owns: intern by content (a
    // backward function the engine runs has its node's, found above).
    if (op.name == 0) op.name = interner_->String(fn.name(), frame.before);
  }
  op.stack = interner_->Stack(stack.pcs, stack.n_pcs, ts.python_frames.data(), stack.n_py,
                              frame.before);
  // Before the node's apply() unpacks (and maybe releases) what it saved.
  if (is_backward && fingerprints_.enabled()) {
    graph_->FingerprintAtUse(op.forward_thread, op.sequence_nr, frame.before);
  }
  const c10::ArrayRef<const c10::IValue> inputs = InputsOf(fn);
  // Inside ranges only (record_function, a compiled region), no node is being built around it.
  const uint64_t building_from =
      ts.op_stack.size() > ts.transparent_scopes ? ts.outermost_sequence_at_start : UINT64_MAX;
  graph_->RefInputNodes(inputs, frame.thread, building_from, ts.unchecked_saves, ts.nodes,
                        frame.before);
  RecordInputs(inputs, frame, ids_, *interner_);
  // The definitions and the inputs' metadata go out now, before the records of the ops nested
  // in this one (which end, and are written, first) can name them or describe those inputs
  // as they changed.
  if (!frame.before.empty()) PushGroupLocked(frame.before);
  ts.op_stack.push_back(op.op);
  ts.op_scopes.push_back(op.scope);
  if (frame.transparent) ++ts.transparent_scopes;
  if (is_backward) ++ts.backward_depth;
  frame.active = true;
}

std::unique_ptr<at::ObserverContext> Session::OnStart(const at::RecordFunction& fn,
                                                      ThreadState& ts) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(ts);
  std::unique_ptr<OpFrame> frame;
  try {
    frame = TakeFrame(ts);
    frame->session = serial_;
    const bool wants_stack = BeginOp(fn, ts, *frame);
    if (frame->deferred) {
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      return OpHandle::Make(ts, std::move(frame));
    }
    CapturedStack stack;
    CaptureStack(ts, wants_stack, stack);
    ReadInputsUnchecked(InputsOf(fn), ts);  // Takes the GIL: before mu_.
    {
      std::lock_guard<std::mutex> lock(mu_);
      StartLocked(fn, ts, *frame, stack);
    }
    ts.unchecked_saves.clear();  // Outside mu_: the tensors may be Python's last references.
  } catch (const std::exception& e) {
    Degrade(std::string("internal error at the start of ") + fn.name() + ": " + e.what(), ts);
    frame.reset();
    ts.fingerprints.clear();
    ts.unchecked_saves.clear();
  }
  // Outside mu_: hashing saved bytes (on CUDA, a kernel and a wait) blocks no other thread.
  if (frame && !ts.fingerprints.empty()) {
    fingerprints_.Take(ts, cuda_tracer_.get(), frame->before);
  }
  // Last: CUDA work launched from here on is this op's.
  if (frame && cuda_tracer_) cuda_tracer_->PushOp(frame->op.op);
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (!frame) return nullptr;
  return OpHandle::Make(ts, std::move(frame));
}

bool Session::EndOnThread(OpFrame& frame, ThreadState& ts) {
  if (cuda_tracer_ && !frame.deferred) cuda_tracer_->PopOp();  // A deferred wrapper pushed none.
  const format::OpRecord& op = frame.op;
  if (!ts.op_stack.empty() && ts.op_stack.back() == op.op) {
    ts.op_stack.pop_back();
    ts.op_scopes.pop_back();
    if (frame.transparent && ts.transparent_scopes > 0) --ts.transparent_scopes;
  }
  if (op.scope == format::OpScope::kBackwardFunction && ts.backward_depth > 0) {
    --ts.backward_depth;
  }
  frame.active = false;
  if (frame.deferred) {
    ts.EndDeferredWrapper(&frame);
    // Nothing but its node's backward function ran in it: not recorded.
    if (op.op == 0) return false;
  }
  return recording();
}

void Session::EndLocked(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  format::OpRecord& op = frame.op;
  EncodedRecords& after = ts.after;  // Also the definitions the nodes name.
  // The nodes this op created, first, so the outputs' TensorInfo can name them.
  graph_->RefCreatedNodes(ts.outputs, frame, ts.outermost_sequence_at_start, ts.saved_hooks,
                          after, ts.nodes);
  if (ts.function_node) {
    graph_->RefFunctionNode(ts.function_node.get(), frame, ts.saved_hooks, ts.unchecked_saves,
                            ts.saved_uses.get(), after, ts.nodes);
  }
  RecordOutputs(ts.outputs, frame, ids_, after);
  NameSavedOutputs(ts.nodes, ts.outputs, op.outputs);
  // Order: the fingerprints taken at the start (before), the definitions and the outputs'
  // metadata as the op left them, the nodes it created (whose saved tensors those describe),
  // the op itself, its node's execution. Pushed under mu_: no other thread names what this group
  // defines before the group is in the queue.
  EncodedRecords& group = ts.group;
  group.AddAll(after);
  for (const format::NodeRecord& node : ts.nodes) group.Add(node);
  group.Add(op);
  if (op.scope == format::OpScope::kBackwardFunction) {
    format::NodeExecRecord exec;
    exec.node = graph_->ExecutedNode(frame);
    exec.op = op.op;
    exec.thread = op.thread;
    exec.start_ns = op.start_ns;
    exec.end_ns = op.end_ns;
    exec.threw = op.threw;
    exec.unpacked = std::move(frame.unpacked);
    group.Add(exec);
  }
  PushGroupLocked(group);
  graph_->NoteOpEnded(frame);
}

void Session::RecordEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  format::OpRecord& op = frame.op;
  op.end_ns = NowNs();
  op.threw = std::uncaught_exceptions() > frame.uncaught_at_start;
  frame.sequence_at_end = at::sequence_number::peek();
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    op.inputs[i].version_after = ReadVersionCounter(frame.input_counters[i].get());
  }
  frame.input_counters.clear();
  // Whatever happens below, the scratch is left empty (and the tensors released).
  struct ClearScratch {
    ~ClearScratch() {
      state.group.clear();
      state.after.clear();
      state.nodes.size = 0;
      state.outputs.clear();
      state.saved_hooks.clear();  // Outside mu_: dropping a Python node takes the GIL.
      state.unchecked_saves.clear();
      state.function_node.reset();
      state.saved_uses.reset();
    }
    ThreadState& state;
  } clear_scratch{ts};
  EncodedRecords& group = ts.group;
  group.AddAll(frame.before);
  frame.before.clear();
  if (options_.fail_at_op != 0 &&
      ops_recorded_.load(std::memory_order_relaxed) + 1 == options_.fail_at_op) {
    throw std::runtime_error("fault injected at this op (RecorderOptions::fail_at_op)");
  }
  CollectOutputs(fn.outputs(), ts.outputs);
  ReadSavedHooks(ts.outputs, ts.saved_hooks);  // Takes the GIL: before mu_.
  // A Python Function's apply: the node made inside it, which no output shows (GIL: before mu_).
  if (op.scope == format::OpScope::kFunction && op.sequence_nr >= 0) {
    compat::NodePtr node = TakeFunctionNode(op.sequence_nr);
    if (node && !op.threw) {
      std::vector<at::Tensor> unchecked;
      ReadUncheckedTensors(*node, unchecked);
      if (!unchecked.empty()) ts.unchecked_saves.emplace_back(node.get(), std::move(unchecked));
      ReadNodeSavedHooks(node.get(), ts.saved_hooks);
      ts.saved_uses = ReadSavedUses(*node);
      ts.function_node = std::move(node);
    }
  }
  if (op.scope == format::OpScope::kBackwardFunction && frame.exec_node_address != nullptr) {
    TakeUnpackedTensors(frame.exec_node_address, frame.unpacked);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    EndLocked(fn, frame, ts);
  }
  ops_recorded_.fetch_add(1, std::memory_order_relaxed);
  // Outside mu_ (hashing bytes blocks no other thread); after the NodeRecords they name.
  if (!ts.fingerprints.empty()) {
    fingerprints_.Take(ts, cuda_tracer_.get(), group);
    std::lock_guard<std::mutex> lock(mu_);
    if (!group.empty()) PushGroupLocked(group);
  }
  if (cuda_tracer_) MaybeFlushCuda();
}

void Session::OnEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(ts);
  if (EndOnThread(frame, ts)) {
    try {
      RecordEnd(fn, frame, ts);
    } catch (const std::exception& e) {
      Degrade(std::string("internal error at the end of ") + fn.name() + ": " + e.what(), ts);
      ts.fingerprints.clear();
    }
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace torchrr::recorder
