// The one place that talks to CUPTI: the CUDA kernels, memory copies and memsets of a run, each
// attributed to the op that launched it.
//
// The recorder wants to know, for every op, what ran on the GPU on its behalf. CUPTI's activity API
// reports each kernel, copy and memset with its times, grid and block, and a correlation id naming
// the CUDA API call that launched it; with external correlation (as PyTorch's profiler, libkineto,
// does), pushing the op's id around the op makes CUPTI also report which correlation ids were
// issued while that op was the innermost one on the launching thread. This module turns those
// records into CudaKernelRecord / CudaMemcpyRecord values with the op filled in and the times on
// the trace's clock, and hands them to a Sink; the recorder interns names and writes them.
//
// CUPTI is reached only through a CuptiApi table of function pointers, filled from libcupti by
// dlopen() (LoadCupti()), so the recorder loads and records on machines without libcupti or
// without a GPU, and tests drive the tracer with a fake table. Built without cupti.h
// (TORCHRR_HAVE_CUPTI undefined), the module compiles to a version whose Start() says it is
// unavailable. Nothing here includes torch.
//
// (Named cupti_tracer.h, not cupti_activity.h: cupti.h includes CUPTI's own <cupti_activity.h>,
// which a header of that name in recorder/src would shadow.)
//
// Inside a training run nothing here throws or aborts: a CUPTI call that fails prints one warning
// ("torchrr: warning: ...") and the tracer stops collecting; the run and the rest of the recording
// go on.
#ifndef TORCHRR_RECORDER_CUPTI_TRACER_H_
#define TORCHRR_RECORDER_CUPTI_TRACER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::recorder {

// The external correlation id of torchrr's own CUDA work (fingerprints): its kernels and copies
// are dropped, not attributed to an op.
inline constexpr uint64_t kOwnCudaWork = ~uint64_t{0};

// The CUPTI functions the tracer calls, as C function pointers. The types mirror CUPTI's so that
// this header needs no cupti.h: CUptiResult, CUpti_ActivityKind and CUpti_ExternalCorrelationKind
// are int-sized C enums (passed as int), CUcontext is a pointer (void*), CUpti_Activity** is
// void**, and CUPTIAPI is empty on Linux. cupti_tracer.cc checks the sizes against cupti.h.
struct CuptiApi {
  using Result = int;  // CUptiResult; 0 is CUPTI_SUCCESS.
  using BufferRequestedFn = void (*)(uint8_t** buffer, size_t* size, size_t* max_records);
  using BufferCompletedFn = void (*)(void* context, uint32_t stream, uint8_t* buffer, size_t size,
                                     size_t valid_size);

  Result (*GetVersion)(uint32_t* version) = nullptr;
  Result (*GetResultString)(Result result, const char** text) = nullptr;
  Result (*GetTimestamp)(uint64_t* ns) = nullptr;
  Result (*ActivityEnable)(int kind) = nullptr;
  Result (*ActivityDisable)(int kind) = nullptr;
  Result (*ActivityRegisterCallbacks)(BufferRequestedFn requested,
                                      BufferCompletedFn completed) = nullptr;
  Result (*ActivityFlushAll)(uint32_t flag) = nullptr;
  Result (*ActivityGetNextRecord)(uint8_t* buffer, size_t valid_size, void** record) = nullptr;
  Result (*ActivityGetNumDroppedRecords)(void* context, uint32_t stream, size_t* dropped) = nullptr;
  Result (*ActivityPushExternalCorrelationId)(int kind, uint64_t id) = nullptr;
  Result (*ActivityPopExternalCorrelationId)(int kind, uint64_t* last_id) = nullptr;
};

// Fills *api from libcupti, loaded with dlopen(): first by soname (libcupti.so.<CUDA major>, then
// libcupti.so; in a torch process this finds the libcupti torch itself links), then beside the
// libcudart already loaded in the process (where pip's nvidia wheels put both), then under
// /usr/local/cuda. The library is never unloaded: CUPTI stays attached to the driver, and its
// buffer callbacks point into this module, for the life of the process.
// Returns false with *why_not set when no libcupti loads, a symbol is missing, its API version is
// older than the cupti.h torchrr was built with (its records would be misread), or torchrr was
// built without cupti.h. Loads once per process and returns the same answer after. Thread-safe.
bool LoadCupti(CuptiApi* api, std::string* why_not);

// Collects the CUDA kernels, memory copies and memsets of the process through CUPTI's activity
// API, from Start() to Stop(), and delivers them to a Sink with their op and trace-clock times.
//
// Attribution: PushOp(id) at each op's start and PopOp() at its end, on the thread running the op,
// make CUPTI report an external correlation record (kind CUSTOM2) for every CUDA API call made
// while that op is the innermost one. A kernel, copy or memset gets the op of the call that
// launched it; one launched outside any op gets op 0. A record whose correlation has not arrived
// yet waits (at most kMaxPendingBuffers further buffers, at most kMaxPending records), then goes
// out with op 0; Stop() delivers everything still waiting.
//
// Timestamps: CUPTI's clock is converted to the trace's clock by an offset measured at Start() and
// again at each Flush(), so the two clocks' drift over a long run stays bounded by the flush
// period. Records CUPTI could not time (start and end 0) keep 0.
//
// One tracer at a time per process (CUPTI's buffer callbacks are process-wide C functions, routed
// here through a static pointer). CUPTI's buffer callbacks are also those of PyTorch's profiler:
// running torch.profiler while a tracer is active takes the buffers from one of them.
class CudaActivityTracer {
 public:
  // What the recorder does with the records. Called with the tracer's lock held, from one thread
  // at a time: CUPTI's own thread (buffers CUPTI completes), or the thread inside Flush() or
  // Stop(). Implementations must not call back into the tracer (that deadlocks) and must not
  // throw (what they throw is caught and stops the tracer with a warning).
  class Sink {
   public:
    virtual ~Sink() = default;
    // A kernel; `name` (its mangled name, as CUPTI gives it) is valid only during the call.
    virtual void OnKernel(const format::CudaKernelRecord& record, std::string_view name) = 0;
    // A memory copy, or a memset (kind kMemset, memset_value set).
    virtual void OnMemcpy(const format::CudaMemcpyRecord& record) = 0;
    // Records CUPTI dropped (its buffers were full, or the tracer refused one), or that could not
    // be read; `reason` is one line for the trace's data-loss record.
    virtual void OnDataLoss(uint64_t records, std::string_view reason) = 0;
    // The end of one delivery (one CUPTI buffer, or Stop()'s last records): the point to push what
    // this delivery gave as one group.
    virtual void OnDeliveryEnd() {}
  };

  // The trace's clock in nanoseconds (the recorder passes NowNs from trace_sink.h).
  using TraceClock = int64_t (*)();

  // 4 MiB: CUPTI recommends buffers of 1-10 MB; libkineto uses 4 MiB so that runs with many small
  // copies do not ask for buffers constantly.
  static constexpr size_t kBufferBytes = 4u << 20;
  // CUPTI's records are 8-byte aligned (ACTIVITY_RECORD_ALIGNMENT), and so must its buffers be.
  static constexpr size_t kBufferAlignment = 8;
  // Buffers CUPTI may hold at once (256 MiB). Past that, buffer requests are refused and CUPTI
  // drops records (and counts them), when its version can refuse safely (API 27 / CUDA 12.9 on:
  // older ones crash on a refused buffer, libkineto found; those are never refused).
  static constexpr int kMaxBuffersHeld = 64;
  // Correlations remembered, in a ring indexed by CUPTI's correlation id (which counts CUDA API
  // calls): a record arriving more than this many calls after its launch is attributed to op 0.
  // 2^18 slots of 16 bytes: 4 MiB.
  static constexpr size_t kCorrelationSlots = size_t{1} << 18;
  // A record whose launch has not been seen waits at most this many further buffers...
  static constexpr int kMaxPendingBuffers = 4;
  // ...and at most this many records wait; the oldest then go out with op 0.
  static constexpr size_t kMaxPending = size_t{1} << 16;
  // The external correlation kind the tracer pushes. libkineto uses CUSTOM0 and CUSTOM1; CUSTOM2
  // keeps the two apart if both run (CUPTI keeps one stack per kind and thread).
  static constexpr int kExternalKind = 5;  // CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2.

  // Registers the buffer callbacks and enables the CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME,
  // DRIVER and EXTERNAL_CORRELATION activity kinds (CUPTI emits external correlation records only
  // for the API calls it records, so RUNTIME and DRIVER are needed: Triton and cuBLAS launch
  // through the driver API). `api` is copied; `sink` must outlive the tracer.
  // Returns nullptr with *why_not set (one line, e.g. "cuptiActivityEnable(CONCURRENT_KERNEL)
  // failed: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)") when CUPTI refuses, a function is missing,
  // another tracer is active, or torchrr was built without cupti.h; then nothing stays enabled.
  // Prints nothing: the caller warns once. Call from a thread outside any op.
  static std::unique_ptr<CudaActivityTracer> Start(const CuptiApi& api, Sink* sink,
                                                   TraceClock trace_clock, std::string* why_not);

  // Stop(). Destroy only once no thread can call PushOp(), PopOp() or Flush() any more.
  ~CudaActivityTracer();
  CudaActivityTracer(const CudaActivityTracer&) = delete;
  CudaActivityTracer& operator=(const CudaActivityTracer&) = delete;

  // At an op's start, on the thread running it: CUDA work launched from here until the matching
  // PopOp() (and not inside a nested op) is attributed to `op_id`. One CUPTI call; thread-safe;
  // call without the recorder's locks held. A no-op once the tracer stopped or failed.
  void PushOp(uint64_t op_id);
  // At the op's end, on the same thread. Pops only what this thread pushed, so it stays balanced
  // after a stop or a failure; pushes an earlier tracer left on this thread (ops that never ended)
  // are popped at this thread's next PushOp(). Thread-safe.
  void PopOp();

  // Asks CUPTI for the buffers whose records are complete (cuptiActivityFlushAll(0)) and delivers
  // them; re-measures the clock offset. Blocks while the Sink runs. Does not wait for the GPU.
  // Thread-safe; call without the recorder's locks held, never from inside the Sink.
  void Flush();

  // Disables the activity kinds, flushes everything CUPTI holds (forced: records of work still
  // running come without times; synchronize the device first for complete records), delivers
  // every record still waiting (op 0 when its correlation never came) and detaches from the
  // buffer callbacks. Idempotent. After Stop() returns, the Sink is not called again. Call without
  // the recorder's locks held, never from inside the Sink.
  void Stop();

  // False once Stop() ran or a CUPTI call failed.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Trace-clock ns minus CUPTI ns, as last measured.
  int64_t clock_offset_ns() const { return clock_offset_ns_.load(std::memory_order_relaxed); }


 private:
  // The buffer callbacks Start() registers with CUPTI; they route to the active tracer.
  static void BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records);
  static void BufferCompleted(void* context, uint32_t stream, uint8_t* buffer, size_t size,
                              size_t valid_size);
  // One correlation id's op: the external id CUPTI reported for it, or 0 when its API record came
  // without one (launched outside any op).
  struct CorrelationSlot {
    uint64_t op = 0;
    uint32_t correlation = 0;
    uint32_t known = 0;
  };
  // A kernel, copy or memset waiting for its correlation.
  struct Pending {
    bool is_kernel = false;
    format::CudaKernelRecord kernel;
    format::CudaMemcpyRecord copy;
    const char* name = nullptr;  // CUPTI's, while in the buffer being read; then `name_copy`.
    std::string name_copy;
    int age = 0;                 // Buffers read since it arrived.
  };

  CudaActivityTracer(const CuptiApi& api, Sink* sink, TraceClock trace_clock);
  // Measures clock_offset_ns_; returns CUPTI's error, or 0.
  CuptiApi::Result MeasureClockOffset();
  // All of the following run with the tracer lock (cupti_tracer.cc) held.
  void ReadBuffer(uint8_t* buffer, size_t valid_size, size_t dropped);
  void ReadRecord(const void* record);
  void Remember(uint32_t correlation, uint64_t op, bool overwrite);
  bool Lookup(uint32_t correlation, uint64_t* op) const;
  // Delivers what can be attributed now (everything when `final`); true if anything went out.
  bool Deliver(bool final);
  void DeliverOne(Pending& pending, uint64_t op);
  void Fail(const char* call, CuptiApi::Result result);
  void Fail(const std::string& why);
  void DisableOnce();
  std::string Describe(CuptiApi::Result result) const;

  const CuptiApi api_;
  Sink* const sink_;
  const TraceClock trace_clock_;
  const uint64_t generation_;  // Tells this tracer's pushes from an earlier tracer's.
  std::atomic<bool> active_{true};
  std::atomic<bool> failed_{false};
  std::atomic<bool> disabled_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> clock_offset_ns_{0};
  std::vector<CorrelationSlot> correlations_;  // Guarded by the tracer lock.
  std::deque<Pending> pending_;                // Guarded by the tracer lock.
  bool read_error_reported_ = false;           // Guarded by the tracer lock.
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_CUPTI_TRACER_H_
