// Reading CUPTI's activity records: kernels, copies and memsets, each tied to the op that
// launched it through the correlation records, and delivered to the sink in order.
#include "cuda/cupti_tracer.h"

#include <utility>

#if TORCHRR_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>

#include "cuda/cupti_layouts.h"
#endif

#include "cuda/cupti_values.h"

namespace torchrr::recorder {

using cupti::DeviceIndex;

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

}  // namespace torchrr::recorder
