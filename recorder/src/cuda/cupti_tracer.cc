#include "cuda/cupti_tracer.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <limits>
#include <mutex>
#include <utility>

#if TORCHRR_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>

#include "cuda/cupti_layouts.h"
#endif

namespace torchrr::recorder {
namespace {

// CUPTI's values, spelled here so that everything but the reading of records and the loader
// builds without cupti.h; checked against it below when it is there.
constexpr CuptiApi::Result kSuccess = 0;
constexpr CuptiApi::Result kErrorMaxLimitReached = 12;
constexpr CuptiApi::Result kErrorInvalidKind = 21;
constexpr CuptiApi::Result kErrorInsufficientPrivileges = 35;
constexpr int kKindMemcpy = 1;
constexpr int kKindMemset = 2;
constexpr int kKindKernel = 3;
constexpr int kKindDriver = 4;
constexpr int kKindRuntime = 5;
constexpr int kKindConcurrentKernel = 10;
constexpr int kKindMemcpy2 = 22;
constexpr int kKindExternalCorrelation = 39;
constexpr uint32_t kFlushForced = 1;  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
// CUPTI API version from which a refused buffer request is safe (CUDA 12.9), per libkineto.
constexpr uint32_t kCanRefuseBuffersFromVersion = 27;

#if TORCHRR_HAVE_CUPTI
static_assert(sizeof(CUptiResult) == sizeof(CuptiApi::Result));
static_assert(sizeof(CUpti_ActivityKind) == sizeof(int));
static_assert(sizeof(CUpti_ExternalCorrelationKind) == sizeof(int));
static_assert(sizeof(CUcontext) == sizeof(void*));
static_assert(CUPTI_SUCCESS == kSuccess);
static_assert(CUPTI_ERROR_MAX_LIMIT_REACHED == kErrorMaxLimitReached);
static_assert(CUPTI_ERROR_INVALID_KIND == kErrorInvalidKind);
static_assert(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES == kErrorInsufficientPrivileges);
static_assert(CUPTI_ACTIVITY_KIND_MEMCPY == kKindMemcpy);
static_assert(CUPTI_ACTIVITY_KIND_MEMSET == kKindMemset);
static_assert(CUPTI_ACTIVITY_KIND_KERNEL == kKindKernel);
static_assert(CUPTI_ACTIVITY_KIND_DRIVER == kKindDriver);
static_assert(CUPTI_ACTIVITY_KIND_RUNTIME == kKindRuntime);
static_assert(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL == kKindConcurrentKernel);
static_assert(CUPTI_ACTIVITY_KIND_MEMCPY2 == kKindMemcpy2);
static_assert(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION == kKindExternalCorrelation);
static_assert(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED == kFlushForced);
static_assert(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2 == CudaActivityTracer::kExternalKind);
static_assert(ACTIVITY_RECORD_ALIGNMENT == CudaActivityTracer::kBufferAlignment);

#endif  // TORCHRR_HAVE_CUPTI

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

int8_t DeviceIndex(uint32_t device) {
  return device <= static_cast<uint32_t>(std::numeric_limits<int8_t>::max())
             ? static_cast<int8_t>(device)
             : int8_t{-1};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading libcupti.

#if TORCHRR_HAVE_CUPTI
namespace {

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Directories of the libcudart and libcupti already loaded in the process.
std::vector<std::string> LoadedCudaDirectories() {
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
        try {
          std::string path = info->dlpi_name;
          std::string base = path.substr(path.rfind('/') + 1);
          if (base.rfind("libcudart.so", 0) == 0 || base.rfind("libcupti.so", 0) == 0) {
            static_cast<std::vector<std::string>*>(data)->push_back(Dirname(path));
          }
        } catch (...) {
          return 1;  // Out of memory: stop walking; what was found is still tried.
        }
        return 0;
      },
      &dirs);
  return dirs;
}

struct Loaded {
  bool ok = false;
  CuptiApi api;
  std::string why_not;
};

template <typename F>
bool Symbol(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing->empty()) *missing = name;
  return *out != nullptr;
}

// Fills `api` from an opened libcupti; returns "" or why it will not do.
std::string Bind(void* handle, const std::string& path, CuptiApi* api) {
  std::string missing;
  Symbol(handle, "cuptiGetVersion", &api->GetVersion, &missing);
  Symbol(handle, "cuptiGetResultString", &api->GetResultString, &missing);
  Symbol(handle, "cuptiGetTimestamp", &api->GetTimestamp, &missing);
  Symbol(handle, "cuptiActivityEnable", &api->ActivityEnable, &missing);
  Symbol(handle, "cuptiActivityDisable", &api->ActivityDisable, &missing);
  Symbol(handle, "cuptiActivityRegisterCallbacks", &api->ActivityRegisterCallbacks, &missing);
  Symbol(handle, "cuptiActivityFlushAll", &api->ActivityFlushAll, &missing);
  Symbol(handle, "cuptiActivityGetNextRecord", &api->ActivityGetNextRecord, &missing);
  Symbol(handle, "cuptiActivityGetNumDroppedRecords", &api->ActivityGetNumDroppedRecords,
         &missing);
  Symbol(handle, "cuptiActivityPushExternalCorrelationId", &api->ActivityPushExternalCorrelationId,
         &missing);
  Symbol(handle, "cuptiActivityPopExternalCorrelationId", &api->ActivityPopExternalCorrelationId,
         &missing);
  if (!missing.empty()) return path + " lacks " + missing;
  uint32_t version = 0;
  CuptiApi::Result result = api->GetVersion(&version);
  if (result != kSuccess) {
    return path + ": cuptiGetVersion failed (error " + std::to_string(result) + ")";
  }
  if (version < kMinCuptiVersion) {
    return path + " is CUPTI API version " + std::to_string(version) + ", older than the " +
           std::to_string(CUPTI_API_VERSION) +
           " of the cupti.h torchrr was built with (its records would be misread)";
  }
  return "";
}

Loaded Load() {
  Loaded loaded;
  const std::string soname = "libcupti.so." + std::to_string(CUDA_VERSION / 1000);
  std::vector<std::string> candidates = {soname, "libcupti.so"};
  for (const std::string& dir : LoadedCudaDirectories()) {
    candidates.push_back(dir + "/" + soname);
    candidates.push_back(dir + "/libcupti.so");
  }
  candidates.push_back("/usr/local/cuda/lib64/" + soname);
  candidates.push_back("/usr/local/cuda/extras/CUPTI/lib64/" + soname);

  std::string first_error;
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      if (first_error.empty()) {
        const char* error = dlerror();
        first_error = error ? error : candidate + ": cannot be loaded";
      }
      continue;
    }
    std::string path = candidate;
    if (void* any = dlsym(handle, "cuptiGetVersion")) {
      Dl_info info;
      if (dladdr(any, &info) != 0 && info.dli_fname != nullptr) path = info.dli_fname;
    }
    CuptiApi api;
    std::string why = Bind(handle, path, &api);
    if (why.empty()) {
      loaded.ok = true;
      loaded.api = api;
      return loaded;  // Never dlclose()d: see LoadCupti().
    }
    dlclose(handle);  // Nothing of it was used.
    if (loaded.why_not.empty()) loaded.why_not = why;
  }
  if (loaded.why_not.empty()) loaded.why_not = "no libcupti could be loaded (" + first_error + ")";
  return loaded;
}

}  // namespace

bool LoadCupti(CuptiApi* api, std::string* why_not) {
  static const Loaded loaded = [] {
    try {
      return Load();
    } catch (const std::exception& e) {
      Loaded failed;
      failed.why_not = std::string("loading libcupti: ") + e.what();
      return failed;
    }
  }();
  if (loaded.ok) {
    *api = loaded.api;
  } else if (why_not != nullptr) {
    *why_not = loaded.why_not;
  }
  return loaded.ok;
}

#else  // !TORCHRR_HAVE_CUPTI

bool LoadCupti(CuptiApi*, std::string* why_not) {
  if (why_not != nullptr) {
    *why_not = "unavailable: torchrr was built without CUPTI's headers (cupti.h)";
  }
  return false;
}

#endif  // TORCHRR_HAVE_CUPTI

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

#if TORCHRR_HAVE_CUPTI
namespace {
// The fields every kernel, copy and memset activity record has, in the trace's terms.
template <typename Activity, typename ToTrace, typename Out>
void FillCommon(const Activity& r, const ToTrace& to_trace, Out& out) {
  out.device = DeviceIndex(r.deviceId);
  out.stream = r.streamId;
  out.correlation = r.correlationId;
  out.start_ns = to_trace(r.start);
  out.end_ns = to_trace(r.end);
}
}  // namespace
#endif

void CudaActivityTracer::ReadRecord(const void* record) {
#if TORCHRR_HAVE_CUPTI
  auto to_trace = [offset = clock_offset_ns_.load(std::memory_order_relaxed)](uint64_t ns) {
    return ns == 0 ? int64_t{0} : static_cast<int64_t>(ns) + offset;  // 0: CUPTI could not time it.
  };
  switch (static_cast<const CUpti_Activity*>(record)->kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto& r = *static_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (r.externalKind == kExternalKind) Remember(r.correlationId, r.externalId, true);
      return;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      // The API call that issued this correlation id. Its external correlation record, when it
      // was made inside an op, came just before it: without one, it was made outside any op.
      const auto& r = *static_cast<const CUpti_ActivityAPI*>(record);
      Remember(r.correlationId, 0, false);
      return;
    }
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto& r = *static_cast<const KernelActivity*>(record);
      Pending pending;
      pending.is_kernel = true;
      format::CudaKernelRecord& k = pending.kernel;
      FillCommon(r, to_trace, k);
      k.grid = {static_cast<uint32_t>(r.gridX), static_cast<uint32_t>(r.gridY),
                static_cast<uint32_t>(r.gridZ)};
      k.block = {static_cast<uint32_t>(r.blockX), static_cast<uint32_t>(r.blockY),
                 static_cast<uint32_t>(r.blockZ)};
      k.shared_memory = static_cast<uint32_t>(r.staticSharedMemory) +
                        static_cast<uint32_t>(r.dynamicSharedMemory);
      k.registers = r.registersPerThread;
      pending.name = r.name != nullptr ? r.name : "";
      pending_.push_back(std::move(pending));
      return;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto& r = *static_cast<const MemcpyActivity*>(record);
      Pending pending;
      format::CudaMemcpyRecord& c = pending.copy;
      switch (r.copyKind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:  // CUDA arrays live on the device.
          c.kind = format::CudaCopyKind::kHostToDevice;
          break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
          c.kind = format::CudaCopyKind::kDeviceToHost;
          break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
          c.kind = format::CudaCopyKind::kDeviceToDevice;
          break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
          c.kind = format::CudaCopyKind::kPeer;
          break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN:
          c.kind = format::CudaCopyKind::kUnknown;
          break;
        default:  // HTOH and kinds newer than this code.
          c.kind = format::CudaCopyKind::kOther;
          break;
      }
      FillCommon(r, to_trace, c);
      c.bytes = r.bytes;
      pending_.push_back(std::move(pending));
      return;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {  // Peer to peer, when CUPTI reports it apart.
      const auto& r = *static_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
      Pending pending;
      format::CudaMemcpyRecord& c = pending.copy;
      c.kind = format::CudaCopyKind::kPeer;
      FillCommon(r, to_trace, c);
      c.bytes = r.bytes;
      pending_.push_back(std::move(pending));
      return;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto& r = *static_cast<const CUpti_ActivityMemset4*>(record);
      Pending pending;
      format::CudaMemcpyRecord& c = pending.copy;
      c.kind = format::CudaCopyKind::kMemset;
      FillCommon(r, to_trace, c);
      c.bytes = r.bytes;
      c.memset_value = r.value;
      pending_.push_back(std::move(pending));
      return;
    }
    default:
      return;  // Kinds enabled by someone else in the process.
  }
#else
  (void)record;
#endif
}

void CudaActivityTracer::Remember(uint32_t correlation, uint64_t op, bool overwrite) {
  CorrelationSlot& slot = correlations_[correlation & (kCorrelationSlots - 1)];
  if (!overwrite && slot.known && slot.correlation == correlation) return;
  slot.op = op;
  slot.correlation = correlation;
  slot.known = 1;
}

bool CudaActivityTracer::Lookup(uint32_t correlation, uint64_t* op) const {
  const CorrelationSlot& slot = correlations_[correlation & (kCorrelationSlots - 1)];
  if (!slot.known || slot.correlation != correlation) return false;
  *op = slot.op;
  return true;
}

bool CudaActivityTracer::Deliver(bool final) {
  bool delivered = false;
  size_t excess = pending_.size() > kMaxPending ? pending_.size() - kMaxPending : 0;
  std::deque<Pending> waiting;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& pending = pending_[i];
    uint32_t correlation = pending.is_kernel ? pending.kernel.correlation
                                             : pending.copy.correlation;
    uint64_t op = 0;
    // Correlation 0: no API call launched it (device-side launches); none will come.
    bool known = correlation == 0 || Lookup(correlation, &op);
    if (known || final || i < excess || pending.age >= kMaxPendingBuffers) {
      DeliverOne(pending, op);
      delivered = true;
      continue;
    }
    ++pending.age;
    if (pending.name != nullptr) {  // CUPTI's string may not outlive its module: keep a copy.
      pending.name_copy = pending.name;
      pending.name = nullptr;
    }
    waiting.push_back(std::move(pending));
  }
  pending_.swap(waiting);
  return delivered;
}

void CudaActivityTracer::DeliverOne(Pending& pending, uint64_t op) {
  if (pending.is_kernel) {
    pending.kernel.op = op;
    sink_->OnKernel(pending.kernel, pending.name != nullptr ? std::string_view(pending.name)
                                                            : std::string_view(pending.name_copy));
  } else {
    pending.copy.op = op;
    sink_->OnMemcpy(pending.copy);
  }
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
