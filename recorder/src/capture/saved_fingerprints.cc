#include "capture/saved_fingerprints.h"

#include <cstdio>
#include <utility>
#include <vector>

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "internals/torch_compat.h"
#include "torchrr/kernels/fingerprint.h"
#include "sink/trace_sink.h"

namespace torchrr::recorder {

FingerprintResult FingerprintTensorBytes(const at::Tensor& tensor, format::FingerprintRecord* out,
                                         std::string* error) {
  try {
    if (!tensor.defined()) return FingerprintResult::kNotReadable;
    const c10::TensorImpl& impl = *tensor.unsafeGetTensorImpl();
    if (!impl.has_storage() || impl.layout() != c10::kStrided) return FingerprintResult::kNotReadable;
    const c10::Storage& storage = impl.unsafe_storage();
    const c10::Device device = storage.device();
    if (device.type() != c10::DeviceType::CPU && device.type() != c10::DeviceType::CUDA) {
      return FingerprintResult::kNotReadable;
    }
    const auto* base = static_cast<const unsigned char*>(storage.data());
    const uint64_t storage_bytes = storage.nbytes();
    const uint64_t item = impl.itemsize();
    uint64_t first = static_cast<uint64_t>(impl.storage_offset()) * item;
    uint64_t length = 0;
    if (impl.numel() > 0) {
      uint64_t last_element = 0;  // Offset of the last element from the first, in elements.
      auto sizes = impl.sizes();
      auto strides = impl.strides();
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (strides[d] < 0) return FingerprintResult::kNotReadable;
        last_element += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
      }
      length = (last_element + 1) * item;
    }
    if (first > storage_bytes) first = storage_bytes;
    if (length > storage_bytes - first) length = storage_bytes - first;
    if (length > 0 && base == nullptr) return FingerprintResult::kNotReadable;
    out->byte_offset = first;
    out->byte_length = length;
    const int index = device.type() == c10::DeviceType::CPU ? -1
                      : device.has_index()                 ? device.index()
                                                           : 0;
    return FingerprintBytes(length > 0 ? base + first : nullptr, length, index, &out->hash, error)
               ? FingerprintResult::kDone
               : FingerprintResult::kFailed;
  } catch (const std::exception& e) {
    *error = e.what();
    return FingerprintResult::kFailed;
  }
}

bool FingerprintBytes(const void* data, size_t bytes, int device, uint64_t* fingerprint,
                      std::string* error) {
  try {
    if (device < 0) {
      *fingerprint = kernels::FingerprintHost(data, bytes);
      return true;
    }
    // CUDA: on the stream the program's kernels are queued on, so the hash sees their results.
    // The stream comes through c10's device-guard interface: no link to c10_cuda.
    const c10::impl::DeviceGuardImplInterface* guard =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Device on(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    void* stream = compat::StreamToFollow(*guard, on);
    return kernels::FingerprintCuda(data, bytes, device, stream, fingerprint, error);
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

void SavedFingerprints::Queue(format::ObjectId node, format::InternId name, uint32_t list_index,
                              const at::Tensor& data, format::ObjectId tensor,
                              format::ObjectId storage, format::FingerprintWhen when) {
  PendingFingerprint pending;
  pending.record.node = node;
  pending.record.saved_name = name;
  pending.record.list_index = list_index;
  pending.record.storage = storage;
  pending.record.tensor = tensor;
  pending.record.when = when;
  pending.data = data;
  t_state->fingerprints.push_back(std::move(pending));
}

void SavedFingerprints::Take(ThreadState& ts, CudaActivityTracer* cuda, EncodedRecords& out) {
  std::vector<PendingFingerprint> pending;
  pending.swap(ts.fingerprints);
  for (PendingFingerprint& p : pending) {
    if (!enabled()) return;
    std::string error;
    // torchrr's own kernels and copies: marked so that CUPTI's records of them are dropped.
    const bool own_cuda = cuda != nullptr && p.data.is_cuda();
    if (own_cuda) cuda->PushOp(kOwnCudaWork);
    FingerprintResult result = FingerprintTensorBytes(p.data, &p.record, &error);
    if (own_cuda) cuda->PopOp();
    if (result == FingerprintResult::kFailed) {
      if (enabled_.exchange(false)) {
        std::fprintf(stderr,
                     "torchrr: warning: --verify-saved turned off: cannot fingerprint a saved "
                     "tensor: %s; recording goes on without fingerprints\n",
                     error.c_str());
      }
      return;
    }
    if (result != FingerprintResult::kDone) continue;
    p.record.time_ns = NowNs();
    out.Add(p.record);
  }
}

}  // namespace torchrr::recorder
