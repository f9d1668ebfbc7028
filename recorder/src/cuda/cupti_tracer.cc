#include "cuda/cupti_tracer.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <utility>

#if TORCHRR_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>

#include "cuda/cupti_layouts.h"
#endif

#include "cuda/cupti_values.h"

namespace torchrr::recorder {
namespace {

using cupti::kCanRefuseBuffersFromVersion;
using cupti::kErrorInsufficientPrivileges;
using cupti::kErrorInvalidKind;
using cupti::kErrorMaxLimitReached;
using cupti::kFlushForced;
using cupti::kKindConcurrentKernel;
using cupti::kKindDriver;
using cupti::kKindExternalCorrelation;
using cupti::kKindMemcpy;
using cupti::kKindMemset;
using cupti::kKindRuntime;
using cupti::kSuccess;

// The kinds Start() enables, with the names its messages give them. EXTERNAL_CORRELATION last:
// every kind it correlates is on before the first correlation record.
struct Kind {
  int kind;
  const char* name;
};
constexpr Kind kEnabledKinds[] = {
    {kKindConcurrentKernel, "CONCURRENT_KERNEL"},
    {kKindMemcpy, "MEMCPY"},
    {kKindMemset, "MEMSET"},
    {kKindRuntime, "RUNTIME"},
    {kKindDriver, "DRIVER"},
    {kKindExternalCorrelation, "EXTERNAL_CORRELATION"},
};

// The tracer lock: guards g_tracer and the active tracer's reading of buffers, so that a buffer
// CUPTI completes on its thread never reaches a tracer that Stop() detached.
std::mutex g_tracer_mu;
CudaActivityTracer* g_tracer = nullptr;  // Guarded by g_tracer_mu.
std::atomic<uint64_t> g_generation{0};
// Buffers handed to CUPTI and not yet returned; whether CUPTI survives a refused request.
std::atomic<int> g_buffers_held{0};
std::atomic<bool> g_can_refuse_buffers{false};
std::atomic<bool> g_refusal_warned{false};
// cuptiActivityGetNumDroppedRecords of the active tracer's table, called without the tracer lock:
// CUPTI may hold its own lock around a buffer request, and libkineto saw that order deadlock.
std::atomic<CuptiApi::Result (*)(void*, uint32_t, size_t*)> g_dropped_records{nullptr};

// What this thread pushed for the tracer of `generation` and has not popped yet.
struct ThreadPushes {
  uint64_t generation = 0;
  uint32_t depth = 0;
};
thread_local ThreadPushes t_pushes;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Starting and stopping.

CudaActivityTracer::CudaActivityTracer(const CuptiApi& api, Sink* sink, TraceClock trace_clock)
    : api_(api),
      sink_(sink),
      trace_clock_(trace_clock),
      generation_(g_generation.fetch_add(1) + 1),
      correlations_(kCorrelationSlots) {}

std::unique_ptr<CudaActivityTracer> CudaActivityTracer::Start(const CuptiApi& api, Sink* sink,
                                                              TraceClock trace_clock,
                                                              std::string* why_not) {
  std::string ignored;
  if (why_not == nullptr) why_not = &ignored;
#if !TORCHRR_HAVE_CUPTI
  (void)api;
  (void)sink;
  (void)trace_clock;
  *why_not = "unavailable: torchrr was built without CUPTI's headers (cupti.h)";
  return nullptr;
#else
  if (sink == nullptr || trace_clock == nullptr) {
    *why_not = "no sink or no trace clock given";
    return nullptr;
  }
  const std::pair<bool, const char*> functions[] = {
      {api.GetVersion != nullptr, "cuptiGetVersion"},
      {api.GetTimestamp != nullptr, "cuptiGetTimestamp"},
      {api.ActivityEnable != nullptr, "cuptiActivityEnable"},
      {api.ActivityDisable != nullptr, "cuptiActivityDisable"},
      {api.ActivityRegisterCallbacks != nullptr, "cuptiActivityRegisterCallbacks"},
      {api.ActivityFlushAll != nullptr, "cuptiActivityFlushAll"},
      {api.ActivityGetNextRecord != nullptr, "cuptiActivityGetNextRecord"},
      {api.ActivityPushExternalCorrelationId != nullptr, "cuptiActivityPushExternalCorrelationId"},
      {api.ActivityPopExternalCorrelationId != nullptr, "cuptiActivityPopExternalCorrelationId"},
  };
  for (const auto& [present, name] : functions) {
    if (!present) {
      *why_not = std::string("CUPTI function ") + name + " missing";
      return nullptr;
    }
  }

  std::unique_ptr<CudaActivityTracer> tracer;
  try {
    tracer.reset(new CudaActivityTracer(api, sink, trace_clock));
  } catch (const std::exception& e) {
    *why_not = std::string("out of memory: ") + e.what();
    return nullptr;
  }
  // A tracer that never started must not flush or disable anything when destroyed.
  tracer->stopped_ = true;
  tracer->active_ = false;

  uint32_t version = 0;
  CuptiApi::Result result = api.GetVersion(&version);
  if (result != kSuccess) {
    *why_not = "cuptiGetVersion failed: " + tracer->Describe(result);
    return nullptr;
  }
  result = tracer->MeasureClockOffset();
  if (result != kSuccess) {
    *why_not = "cuptiGetTimestamp failed: " + tracer->Describe(result);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_tracer_mu);
    if (g_tracer != nullptr) {
      *why_not = "another CUDA activity tracer is running in this process";
      return nullptr;
    }
    g_tracer = tracer.get();
  }
  auto detach = [&tracer] {
    std::lock_guard<std::mutex> lock(g_tracer_mu);
    if (g_tracer == tracer.get()) g_tracer = nullptr;
  };
  g_can_refuse_buffers = version >= kCanRefuseBuffersFromVersion;
  g_dropped_records = api.ActivityGetNumDroppedRecords;

  result = api.ActivityRegisterCallbacks(&CudaActivityTracer::BufferRequested,
                                         &CudaActivityTracer::BufferCompleted);
  if (result != kSuccess) {
    *why_not = "cuptiActivityRegisterCallbacks failed: " + tracer->Describe(result);
    detach();
    return nullptr;
  }
  for (size_t i = 0; i < std::size(kEnabledKinds); ++i) {
    result = api.ActivityEnable(kEnabledKinds[i].kind);
    if (result != kSuccess) {
      *why_not = std::string("cuptiActivityEnable(") + kEnabledKinds[i].name +
                 ") failed: " + tracer->Describe(result);
      for (size_t j = 0; j < i; ++j) api.ActivityDisable(kEnabledKinds[j].kind);
      detach();
      return nullptr;
    }
  }
  tracer->stopped_ = false;
  tracer->active_ = true;
  return tracer;
#endif  // TORCHRR_HAVE_CUPTI
}

CudaActivityTracer::~CudaActivityTracer() { Stop(); }

void CudaActivityTracer::Stop() {
  if (stopped_.exchange(true)) return;
  active_ = false;
  // Disabled first, then flushed: nothing new arrives after the flush (libkineto's order too).
  DisableOnce();
  CuptiApi::Result result = api_.ActivityFlushAll(kFlushForced);
  if (result != kSuccess) Fail("cuptiActivityFlushAll", result);
  std::lock_guard<std::mutex> lock(g_tracer_mu);
  try {
    if (Deliver(/*final=*/true)) sink_->OnDeliveryEnd();
  } catch (const std::exception& e) {
    Fail(std::string("delivering CUDA activity records: ") + e.what());
  } catch (...) {
    Fail("delivering CUDA activity records: unknown exception");
  }
  pending_.clear();
  if (g_tracer == this) g_tracer = nullptr;
}

void CudaActivityTracer::DisableOnce() {
  if (disabled_.load(std::memory_order_relaxed) || disabled_.exchange(true)) return;
  // What fails here changes nothing more: the tracer is stopping either way.
  for (const Kind& kind : kEnabledKinds) api_.ActivityDisable(kind.kind);
}

CuptiApi::Result CudaActivityTracer::MeasureClockOffset() {
  // The narrowest of three brackets of the trace clock around CUPTI's, read at its middle.
  int64_t best_width = std::numeric_limits<int64_t>::max();
  int64_t best_offset = 0;
  for (int i = 0; i < 3; ++i) {
    uint64_t cupti_ns = 0;
    int64_t before = trace_clock_();
    CuptiApi::Result result = api_.GetTimestamp(&cupti_ns);
    int64_t after = trace_clock_();
    if (result != kSuccess) return result;
    if (after - before < best_width) {
      best_width = after - before;
      best_offset = before + best_width / 2 - static_cast<int64_t>(cupti_ns);
    }
  }
  clock_offset_ns_.store(best_offset, std::memory_order_relaxed);
  return kSuccess;
}

// ---------------------------------------------------------------------------------------------
// Ops.

void CudaActivityTracer::PushOp(uint64_t op_id) {
  ThreadPushes& pushes = t_pushes;
  if (pushes.generation != generation_) {
    // What an earlier tracer pushed on this thread for ops that never ended would attribute this
    // tracer's launches to another trace's ops: CUPTI's stacks live as long as the thread.
    for (; pushes.depth > 0; --pushes.depth) {
      api_.ActivityPopExternalCorrelationId(kExternalKind, nullptr);
    }
    pushes.generation = generation_;
  }
  if (!active_.load(std::memory_order_relaxed)) {
    if (failed_.load(std::memory_order_relaxed)) DisableOnce();
    return;
  }
  CuptiApi::Result result = api_.ActivityPushExternalCorrelationId(kExternalKind, op_id);
  if (result != kSuccess) {
    Fail("cuptiActivityPushExternalCorrelationId", result);
    DisableOnce();
    return;
  }
  ++pushes.depth;
}

void CudaActivityTracer::PopOp() {
  ThreadPushes& pushes = t_pushes;
  if (pushes.generation != generation_ || pushes.depth == 0) return;
  --pushes.depth;
  CuptiApi::Result result = api_.ActivityPopExternalCorrelationId(kExternalKind, nullptr);
  if (result != kSuccess && active_.load(std::memory_order_relaxed)) {
    Fail("cuptiActivityPopExternalCorrelationId", result);
    DisableOnce();
  }
}

void CudaActivityTracer::Flush() {
  if (!active_.load(std::memory_order_relaxed)) {
    if (failed_.load(std::memory_order_relaxed)) DisableOnce();
    return;
  }
  CuptiApi::Result result = MeasureClockOffset();
  if (result != kSuccess) {
    Fail("cuptiGetTimestamp", result);
    DisableOnce();
    return;
  }
  result = api_.ActivityFlushAll(0);
  if (result != kSuccess) {
    Fail("cuptiActivityFlushAll", result);
    DisableOnce();
  }
}

// ---------------------------------------------------------------------------------------------
// Buffers. The two callbacks are called by CUPTI through C frames: nothing may escape them.

void CudaActivityTracer::BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = nullptr;
  *size = 0;
  *max_records = 0;  // As many records as fit.
  if (g_can_refuse_buffers.load(std::memory_order_relaxed) &&
      g_buffers_held.load(std::memory_order_relaxed) >= kMaxBuffersHeld) {
    if (!g_refusal_warned.exchange(true)) {
      std::fprintf(stderr,
                   "torchrr: warning: CUPTI holds %d buffers (%zu MiB) of GPU records; it drops "
                   "records until it returns some (the trace counts them as lost)\n",
                   kMaxBuffersHeld, kMaxBuffersHeld * (kBufferBytes >> 20));
    }
    return;
  }
  void* memory = std::aligned_alloc(kBufferAlignment, kBufferBytes);
  if (memory == nullptr) return;  // CUPTI drops records and counts them.
  g_buffers_held.fetch_add(1, std::memory_order_relaxed);
  *buffer = static_cast<uint8_t*>(memory);
  *size = kBufferBytes;
}

void CudaActivityTracer::BufferCompleted(void* context, uint32_t stream, uint8_t* buffer,
                                         size_t /*size*/, size_t valid_size) {
  if (buffer == nullptr) return;
  size_t dropped = 0;
  if (auto dropped_records = g_dropped_records.load(std::memory_order_relaxed)) {
    if (dropped_records(context, stream, &dropped) != kSuccess) dropped = 0;
  }
  try {
    std::lock_guard<std::mutex> lock(g_tracer_mu);
    if (g_tracer != nullptr) {
      try {
        g_tracer->ReadBuffer(buffer, valid_size, dropped);
      } catch (const std::exception& e) {
        g_tracer->Fail(std::string("reading CUPTI's records: ") + e.what());
      } catch (...) {
        g_tracer->Fail("reading CUPTI's records: unknown exception");
      }
    }
  } catch (...) {
    // The lock itself failed; the buffer is lost, the run goes on.
  }
  std::free(buffer);
  g_buffers_held.fetch_sub(1, std::memory_order_relaxed);
}

void CudaActivityTracer::ReadBuffer(uint8_t* buffer, size_t valid_size, size_t dropped) {
  bool delivered = false;
  void* record = nullptr;
  for (;;) {
    CuptiApi::Result result = api_.ActivityGetNextRecord(buffer, valid_size, &record);
    if (result == kSuccess) {
      ReadRecord(record);
      continue;
    }
    if (result == kErrorMaxLimitReached) break;
    if (result == kErrorInvalidKind) {
      // An incomplete or unknown record: CUPTI says to stop there. How many followed is unknown.
      sink_->OnDataLoss(1, "a CUPTI buffer ended in an unreadable record; the records after it "
                           "are lost");
      delivered = true;
      break;
    }
    Fail("cuptiActivityGetNextRecord", result);
    break;
  }
  if (dropped > 0) {
    sink_->OnDataLoss(dropped, "CUPTI dropped GPU activity records (no buffer to put them in)");
    delivered = true;
  }
  if (Deliver(/*final=*/false)) delivered = true;
  if (delivered) sink_->OnDeliveryEnd();
}

// ---------------------------------------------------------------------------------------------
// Errors.

std::string CudaActivityTracer::Describe(CuptiApi::Result result) const {
  const char* text = nullptr;
  if (api_.GetResultString == nullptr || api_.GetResultString(result, &text) != kSuccess) {
    text = nullptr;
  }
  std::string out = text != nullptr ? std::string(text) + " (" + std::to_string(result) + ")"
                                    : "CUPTI error " + std::to_string(result);
  if (result == kErrorInsufficientPrivileges) {
    out += "; the driver restricts GPU profiling to administrators "
           "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)";
  }
  return out;
}

void CudaActivityTracer::Fail(const char* call, CuptiApi::Result result) {
  try {
    Fail(std::string(call) + " failed: " + Describe(result));
  } catch (...) {
    Fail(std::string());
  }
}

void CudaActivityTracer::Fail(const std::string& why) {
  active_.store(false, std::memory_order_relaxed);
  if (failed_.exchange(true)) return;
  std::fprintf(stderr,
               "torchrr: warning: CUDA kernels are no longer recorded: %s; the recording goes on "
               "without them\n",
               why.empty() ? "a CUPTI call failed" : why.c_str());
}

}  // namespace torchrr::recorder
