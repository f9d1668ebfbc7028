// Session: one recording, from the moment its RecordFunction callbacks are registered to Stop().
//
// The callbacks run on every thread that dispatches an op (training threads, autograd's worker
// threads, the optimizer). The start callback takes what is only valid then (the inputs, their
// versions, the stack) and hands the TraceSink what it defined (strings, stacks, the inputs'
// metadata when new or changed) before any op nested in this one runs; the end callback adds the
// outputs, the versions after the op, the autograd nodes the op created (with what each saved)
// and, for a node running in backward, its execution, and hands them over in one group. Shared
// tables (ids, interned strings and stacks) are guarded by one mutex taken once per callback;
// groups are handed over under it, so a definition reaches the trace before any use of it.
//
// The session holds the lock and the order of things; what is recorded is built by the pieces it
// owns: the interner (strings, stacks), the id registry (tensors, storages, counters, nodes),
// the graph capture (nodes and what they saved), op_arguments (inputs and outputs) and the saved
// fingerprints. Per-thread state is thread_state's; which ops are recorded, op_filter's.
//
// Nothing here throws into the program or aborts it: a callback that fails stops the recording
// with one warning.
#ifndef TORCHRR_RECORDER_SESSION_H_
#define TORCHRR_RECORDER_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <sys/types.h>

#include <ATen/record_function.h>

#include "cuda/cupti_tracer.h"
#include "capture/graph_capture.h"
#include "capture/id_registry.h"
#include "capture/interner.h"
#include "sink/record_bytes.h"
#include "capture/finite_ranges.h"
#include "capture/saved_fingerprints.h"
#include "session/thread_state.h"
#include "torchrr/format/records.h"
#include "torchrr/recorder.h"
#include "sink/trace_sink.h"

namespace torchrr::recorder {

class Session {
 public:
  // Opens the trace and registers the callbacks. Returns nullptr (and sets *error) when the trace
  // cannot be opened or another session is recording.
  static std::shared_ptr<Session> Start(const RecorderOptions& options, std::string* error);
  ~Session();

  // Unregisters the callbacks, waits for callbacks in flight, closes the trace. Idempotent. In a
  // process forked from the recording one, only marks the session stopped (the trace is the
  // parent's, and the child has none of its threads) and stops the child's own recording
  // (RecorderOptions::follow_forks), if it has one.
  void Stop();
  bool recording() const { return recording_.load(std::memory_order_acquire); }
  // RecorderOptions::all_ops, or verify_saved (a write that no counter sees may come
  // from such an op).
  bool records_all_ops() const {
    return options_.all_ops || options_.verify_saved;
  }

  void RecordError(format::ErrorKind kind, const std::string& type, const std::string& message);
  // A StepRecord marked by the program (Recorder::Step, torchrr.step()).
  void MarkStep();
  // Recorder::Flush: the pending groups to the sink, then the sink's flush. Thread-safe.
  bool Flush();

  uint64_t ops_recorded() const { return ops_recorded_.load(std::memory_order_relaxed); }
  uint64_t records_dropped() const { return sink_ ? sink_->dropped_records() : 0; }

  // True on a thread that is inside an op this session records (and not inside torchrr's own
  // code): an exception thrown there comes out of that op.
  static bool ThreadInsideRecordedOp();

  // The session recording now, or nullptr. Used by the callbacks, the terminate handler and the
  // Python bindings.
  static std::shared_ptr<Session> Active();

  // In a forked child of a session that follows forks, before its first op: starts the child's
  // own recording (FILE.pidN.EXT) and returns it, or returns nullptr (another thread started it,
  // the child's recording was stopped, or its trace cannot be opened: one warning). Called by the
  // start callback; thread-safe.
  static Session* StartInForkedChild(ThreadState& ts);

  // Which session this is, among those this process started or inherited: an op's frame carries
  // it, so that only the session that started an op ends it.
  uint64_t serial() const { return serial_; }

  // Callback bodies (public for the static trampolines).
  // `folded`: an op recorded only because of all_ops (FoldedIntoTheOpAround).
  std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn, ThreadState& ts,
                                               bool folded);
  void OnEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts);

 private:
  explicit Session(const RecorderOptions& options);
  // Start() with g_active_mu held: opens the trace and registers the callbacks (in a forked
  // child, takes over those the parent registered).
  static std::shared_ptr<Session> OpenLocked(const RecorderOptions& options, std::string* error);
  // pthread_atfork's child handler: see active_session.cc.
  static void AfterForkInChild();
  // Stops with one warning and an ErrorRecord (kRecorder) that says why and in which op on `ts`'s
  // thread; for failures inside callbacks. The callback's lock must not be held.
  void Degrade(const std::string& why, const ThreadState& ts);
  // Hands `group` over and clears it. Called with mu_ held, so that groups reach the trace in the
  // order their definitions were made, on every thread. Groups gather in pending_ and go to the
  // sink pending_bytes_ at a time (one sink lock per batch, not per op); the writer thread takes
  // what is pending each time it looks at the queue (PullPending), so a batch waits no longer than
  // the queue's own poll.
  void PushGroupLocked(EncodedRecords& group);
  // Pushes the group fill(ThreadState&, EncodedRecords&) builds under the lock, for the program's
  // own calls from outside any op (an error, a step mark) on a thread that recorded before.
  template <class Fill>
  void PushFromProgram(Fill&& fill);
  void FlushPendingLocked(bool may_wait);
  void PullPending();  // The writer thread's: skips when mu_ is busy.
  void ForgetInterned();  // After a dropped group: everything is defined again on next use.

  // The steps of OnStart, in order. BeginOp fills in what the RecordFunction says and returns
  // whether the op gets a stack; a deferred engine wrapper ends there (Defer). StartLocked, with
  // mu_ held, gives the op its id and names and records its inputs.
  bool BeginOp(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame);
  void Defer(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame);
  struct CapturedStack;
  void CaptureStack(ThreadState& ts, bool wants_stack, CapturedStack& stack);
  void StartLocked(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame,
                   CapturedStack& stack);
  // The steps of OnEnd. EndOnThread takes the op off the thread's stacks and says whether it is
  // to be recorded; EndLocked, with mu_ held, records its outputs, the nodes it created and, for a
  // backward function, its node's execution, and pushes the op's group.
  bool EndOnThread(OpFrame& frame, ThreadState& ts);
  void RecordEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts);
  void EndLocked(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts);

  // Records the deferred engine wrappers on the thread's op stack (their ids, names and parents,
  // for the records their ends write), the innermost on top of it; returns the top's id. mu_ held.
  format::ObjectId RecordDeferredWrapper(ThreadState& ts, EncodedRecords& out);

  // CUDA work from CUPTI: interned and pushed as groups of their own.
  class CudaSink;
  // CUPTI starts at the first op that touches a CUDA device: a run on the CPU of a machine with a
  // GPU never loads it, and pays nothing for it.
  void MaybeStartCudaTracer(c10::ArrayRef<const c10::IValue> inputs);
  void StartCudaTracer();
  void MaybeFlushCuda();
  CudaActivityTracer* cuda_tracer() const { return cuda_tracer_.load(std::memory_order_acquire); }

  const RecorderOptions options_;
  const pid_t pid_;  // The recording process's; another is a forked child.
  const uint64_t serial_;
  // In a forked child: the child's own recording, started from this session (follow_forks).
  // Guarded by g_active_mu; never set in the process that started this session.
  std::shared_ptr<Session> forked_child_;
  std::unique_ptr<TraceSink> sink_;
  std::atomic<bool> recording_{false};
  SavedFingerprints fingerprints_;  // options_.verify_saved until a fingerprint fails.
  FiniteRanges finite_ranges_;      // options_.check_finite.
  std::unique_ptr<CudaActivityTracer::Sink> cuda_sink_;  // A CudaSink (session_cuda.cc).
  std::atomic<bool> draining_cuda_{false};  // Stop() takes CUPTI's last delivery.
  // cuda_tracer_ is set once, from inside an op (counted in in_flight_), and reset by Stop() after
  // the callbacks are gone: read without a lock. cuda_pending_: a device is there and no op has
  // tried to start CUPTI yet (set before the callbacks are registered; the first op that touches
  // the device clears it, so that no op looks at its inputs for this again, whether CUPTI
  // started or not).
  std::atomic<bool> cuda_pending_{false};
  std::unique_ptr<CudaActivityTracer> cuda_tracer_owner_;
  std::atomic<CudaActivityTracer*> cuda_tracer_{nullptr};
  std::atomic<int64_t> last_cuda_flush_ns_{0};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> ops_recorded_{0};
  at::CallbackHandle callback_handle_ = 0;
  std::once_flag stop_once_;

  std::mutex mu_;
  EncodedRecords pending_;    // Guarded by mu_: groups not yet handed to the sink.
  size_t pending_bytes_ = 0;  // When pending_ goes to the sink (set at start).
  // Guarded by mu_. The interner and the graph are made once the sink (whose id counters the
  // interner shares) is open.
  std::optional<Interner> interner_;
  IdRegistry ids_;
  std::optional<GraphCapture> graph_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_SESSION_H_
