// finite.h's CUDA entry points: finiteness scans of device memory, queued without waiting.
//
// A scan is one kernel launch: a grid-stride loop over the elements of the merged view
// (finite_view.h), each thread accumulating flags and its largest finite magnitude, reduced over
// each block (warp shuffles, then shared memory) into one atomicOr and one atomicMax on the slot.
// A contiguous view is read with 16-byte loads; any other with one load per element at an offset
// computed from the element's index.
//
// Like fingerprint.cu, this is linked with a static CUDA runtime into a library loaded by PyTorch
// (cuda_context.h): no context of our own, the calling thread's current context left as it was
// found, every error returned as text.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_context.h"
#include "finite_view.h"
#include "torchrr/kernels/fingerprint.h"
#include "torchrr/kernels/finite.h"

namespace torchrr::kernels {
namespace {

using cuda_context::Describe;
using cuda_context::DeviceScope;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Resident blocks per SM that the grid-stride loops are sized for: 2048 threads, an SM's most.
constexpr int kBlocksPerSm = 2048 / kThreads;
// The most dims a view may have once merged; no loop over them.
constexpr int kMaxCudaDims = 8;
constexpr int kVectorBytes = 16;

// A merged view, passed to the kernel by value (136 bytes of parameters).
struct StridedDims {
  int dims;
  int64_t sizes[kMaxCudaDims];    // Outermost first.
  int64_t strides[kMaxCudaDims];  // > 0.
};

// One thread's part of a scan.
template <FloatKind kKind>
struct ThreadScan {
  using Format = FloatFormat<kKind>;
  using Bits = typename Format::Bits;
  static constexpr Bits kMagnitude = static_cast<Bits>(~Format::kSign);
  static constexpr Bits kNegInf = static_cast<Bits>(Format::kSign | Format::kInf);

  uint32_t flags = 0;
  Bits max_abs = 0;

  __device__ __forceinline__ void Add(Bits bits) {
    const Bits magnitude = bits & kMagnitude;
    flags |= (magnitude > Format::kInf ? kHasNan : 0u) | (bits == Format::kInf ? kHasPosInf : 0u) |
             (bits == kNegInf ? kHasNegInf : 0u);
    if (magnitude < Format::kInf && magnitude > max_abs) max_abs = magnitude;
  }

  // The double bits of the largest finite magnitude (non-negative: they order as integers).
  __device__ __forceinline__ unsigned long long MaxAbsBits() const {
    return static_cast<unsigned long long>(
        __double_as_longlong(Format::MagnitudeToDouble(max_abs)));
  }
};

__device__ __forceinline__ unsigned long long Max(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

// ORs and maxes every thread's part into *slot: one atomic of each per block. Every thread of the
// block must call it.
__device__ void CommitBlock(uint32_t flags, unsigned long long max_abs_bits, FiniteSlot* slot) {
  __shared__ uint32_t warp_flags[kWarps];
  __shared__ unsigned long long warp_max[kWarps];
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) {
    flags |= __shfl_xor_sync(0xffffffffu, flags, lanes);
    max_abs_bits = Max(max_abs_bits, __shfl_xor_sync(0xffffffffu, max_abs_bits, lanes));
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_flags[warp] = flags;
    warp_max[warp] = max_abs_bits;
  }
  __syncthreads();
  if (warp != 0) return;
  flags = lane < kWarps ? warp_flags[lane] : 0;
  max_abs_bits = lane < kWarps ? warp_max[lane] : 0;
#pragma unroll
  for (int lanes = kWarps / 2; lanes > 0; lanes /= 2) {
    flags |= __shfl_xor_sync(0xffffffffu, flags, lanes);
    max_abs_bits = Max(max_abs_bits, __shfl_xor_sync(0xffffffffu, max_abs_bits, lanes));
  }
  // Zero changes nothing: the empty result needs no atomic.
  if (lane == 0 && flags != 0) atomicOr(&slot->flags, flags);
  if (lane == 0 && max_abs_bits != 0) {
    atomicMax(reinterpret_cast<unsigned long long*>(&slot->max_abs_bits), max_abs_bits);
  }
}

// Scans `count` contiguous elements at `data` (aligned to their size): the elements before the
// first 16-byte boundary one by one, then 16-byte vectors, then the elements after the last.
template <FloatKind kKind>
__global__ void __launch_bounds__(kThreads)
    ContiguousKernel(const typename FloatFormat<kKind>::Bits* data, uint64_t count,
                     FiniteSlot* slot) {
  using Bits = typename FloatFormat<kKind>::Bits;
  constexpr int kPerVector = kVectorBytes / sizeof(Bits);
  ThreadScan<kKind> scan;
  const uint64_t thread = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const VectorSplit split =
      SplitIntoVectors(reinterpret_cast<uintptr_t>(data), count, sizeof(Bits));
  if (thread < split.head) scan.Add(data[thread]);
  const auto* vectors = reinterpret_cast<const uint4*>(data + split.head);
  for (uint64_t v = thread; v < split.vectors; v += threads) {
    const uint4 vector = __ldg(vectors + v);
    Bits words[kPerVector];
    memcpy(words, &vector, sizeof(vector));
#pragma unroll
    for (int k = 0; k < kPerVector; ++k) scan.Add(words[k]);
  }
  for (uint64_t i = split.head + split.vectors * kPerVector + thread; i < count; i += threads) {
    scan.Add(data[i]);
  }
  CommitBlock(scan.flags, scan.MaxAbsBits(), slot);
}

// Scans the `count` elements of `view` at `data`, element i (in row-major order) at the offset its
// indices give. `Index` is uint32_t when count + the grid's threads fits, for 32-bit divisions.
template <FloatKind kKind, typename Index>
__global__ void __launch_bounds__(kThreads)
    StridedKernel(const typename FloatFormat<kKind>::Bits* data, StridedDims view, Index count,
                  FiniteSlot* slot) {
  ThreadScan<kKind> scan;
  const Index thread = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = thread; i < count; i += threads) {
    scan.Add(data[ElementOffset<kMaxCudaDims>(i, view.dims, view.sizes, view.strides)]);
  }
  CommitBlock(scan.flags, scan.MaxAbsBits(), slot);
}

bool Fail(std::string* error, const std::string& message) {
  if (error != nullptr) *error = "torchrr finite scan: " + message;
  return false;
}

// False, with Describe(rc, what) in *error, when `rc` is an error.
bool Check(cudaError_t rc, const char* what, std::string* error) {
  return rc == cudaSuccess || Fail(error, Describe(rc, what));
}

// Blocks for `work` items at one item per thread per round, up to a full device's resident blocks
// (the grid-stride loop does the rest); at least one.
unsigned GridBlocks(uint64_t work, int sms) {
  const uint64_t wanted = (work + kThreads - 1) / kThreads;
  const uint64_t resident = static_cast<uint64_t>(sms > 0 ? sms : 1) * kBlocksPerSm;
  return static_cast<unsigned>(wanted == 0 ? 1 : wanted < resident ? wanted : resident);
}

template <FloatKind kKind>
bool Launch(const unsigned char* first, const MergedView& view, int sms, cudaStream_t stream,
            FiniteSlot* slot, std::string* error) {
  using Bits = typename FloatFormat<kKind>::Bits;
  const auto* data = reinterpret_cast<const Bits*>(first);
  uint64_t count = 1;
  for (int d = 0; d < view.dims; ++d) count *= static_cast<uint64_t>(view.sizes[d]);
  if (view.dims == 0 || (view.dims == 1 && view.strides[0] == 1)) {
    const uint64_t work = count / (kVectorBytes / sizeof(Bits)) + 1;
    ContiguousKernel<kKind><<<GridBlocks(work, sms), kThreads, 0, stream>>>(data, count, slot);
  } else {
    StridedDims dims{};
    dims.dims = view.dims;
    for (int d = 0; d < view.dims; ++d) {
      dims.sizes[d] = view.sizes[d];
      dims.strides[d] = view.strides[d];
    }
    const unsigned blocks = GridBlocks(count, sms);
    // Below 2^31, i + threads (< 2^31 too) cannot wrap in 32 bits.
    if (count <= INT32_MAX) {
      StridedKernel<kKind, uint32_t>
          <<<blocks, kThreads, 0, stream>>>(data, dims, static_cast<uint32_t>(count), slot);
    } else {
      StridedKernel<kKind, uint64_t><<<blocks, kThreads, 0, stream>>>(data, dims, count, slot);
    }
  }
  return Check(cudaGetLastError(), "scan kernel launch", error);
}

// The device of each live allocation of slots: FreeFiniteSlotsCuda is not told it, and frees in
// that device's context (cudaFree on a thread with no current context would create one on device
// 0). Thread-safe.
class SlotDevices {
 public:
  void Add(const FiniteSlot* slots, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_[slots] = device;
  }

  // The device `slots` were allocated on, forgotten; -1 when they are not AllocFiniteSlotsCuda's.
  int Remove(const FiniteSlot* slots) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(slots);
    if (it == devices_.end()) return -1;
    const int device = it->second;
    devices_.erase(it);
    return device;
  }

 private:
  std::mutex mu_;
  std::map<const FiniteSlot*, int> devices_;  // Guarded by mu_.
};

SlotDevices& AllocatedSlots() {
  static SlotDevices* devices = new SlotDevices;  // Never destroyed: frees may come at exit.
  return *devices;
}

}  // namespace

bool CudaFiniteAvailable() { return CudaFingerprintAvailable(); }

FiniteSlot* AllocFiniteSlotsCuda(int device, size_t count, std::string* error) {
  if (count == 0) {
    Fail(error, "no slots asked for (count 0)");
    return nullptr;
  }
  cudaGetLastError();  // An earlier failure on this thread is not this call's.
  DeviceScope scope;
  std::string why;
  if (!scope.Enter(device, &why)) {
    Fail(error, why);
    return nullptr;
  }
  void* memory = nullptr;
  if (!Check(cudaMalloc(&memory, count * sizeof(FiniteSlot)), "cudaMalloc (slots)", error)) {
    return nullptr;
  }
  // Zeroed on a stream of our own and waited for, so that a scan queued next on any stream (a
  // non-blocking one included) finds the slots zero, without waiting for the user's work.
  cudaStream_t stream = nullptr;
  bool zeroed = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags", error);
  zeroed = zeroed && Check(cudaMemsetAsync(memory, 0, count * sizeof(FiniteSlot), stream),
                           "cudaMemsetAsync (slots)", error);
  zeroed = zeroed && Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", error);
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (!zeroed) {
    cudaFree(memory);
    return nullptr;
  }
  auto* slots = static_cast<FiniteSlot*>(memory);
  AllocatedSlots().Add(slots, device);
  return slots;
}

void FreeFiniteSlotsCuda(FiniteSlot* slots) {
  if (slots == nullptr) return;
  // Not ours (or freed already): freeing it could free someone else's memory.
  const int device = AllocatedSlots().Remove(slots);
  if (device < 0) return;
  cudaGetLastError();
  DeviceScope scope;
  std::string why;
  if (scope.Enter(device, &why)) cudaFree(slots);
  cudaGetLastError();  // Errors are dropped (finite.h), not left for the next call.
}

bool ScanFiniteCudaAsync(const void* device_data, FloatKind kind, const int64_t* sizes,
                         const int64_t* strides, int dims, int device, void* stream,
                         FiniteSlot* device_slot, std::string* error) {
  if (device_slot == nullptr) return Fail(error, "no slot for the result (null)");
  if (dims < 0 || (dims > 0 && (sizes == nullptr || strides == nullptr))) {
    return Fail(error, "bad view (negative dims, or null sizes or strides)");
  }
  MergedView view;
  if (!MergeView(sizes, strides, dims, &view)) {
    return Fail(error, "a view of " + std::to_string(dims) + " dims is too large for any tensor");
  }
  cudaGetLastError();  // An earlier failure on this thread is not this call's.
  DeviceScope scope;
  std::string why;
  if (!scope.Enter(device, &why)) return Fail(error, why);
  // After the device check, so that an absent device fails the same way for every view.
  if (view.empty) return true;
  if (device_data == nullptr) return Fail(error, "null device pointer for a non-empty view");
  const int element_bytes = ElementBytes(kind);
  if (reinterpret_cast<uintptr_t>(device_data) % element_bytes != 0) {
    return Fail(error,
                "data not aligned to its " + std::to_string(element_bytes) + "-byte elements");
  }
  if (view.dims > kMaxCudaDims) {
    return Fail(error, "the view has " + std::to_string(view.dims) +
                           " dims that do not merge; the CUDA scan takes at most " +
                           std::to_string(kMaxCudaDims));
  }
  int sms = 0;
  if (!Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute (SMs)", error)) {
    return false;
  }
  const auto* first = static_cast<const unsigned char*>(device_data) + view.offset * element_bytes;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (kind) {
    case FloatKind::kFloat16:
      return Launch<FloatKind::kFloat16>(first, view, sms, cuda_stream, device_slot, error);
    case FloatKind::kBFloat16:
      return Launch<FloatKind::kBFloat16>(first, view, sms, cuda_stream, device_slot, error);
    case FloatKind::kFloat32:
      return Launch<FloatKind::kFloat32>(first, view, sms, cuda_stream, device_slot, error);
    case FloatKind::kFloat64:
      return Launch<FloatKind::kFloat64>(first, view, sms, cuda_stream, device_slot, error);
  }
  return Fail(error, "unknown FloatKind " + std::to_string(static_cast<int>(kind)));
}

bool ReadFiniteSlotsCuda(const FiniteSlot* device_slots, size_t count, int device, void* stream,
                         FiniteScan* out, std::string* error) {
  if (count == 0) return true;
  if (device_slots == nullptr || out == nullptr) return Fail(error, "null slots or output");
  cudaGetLastError();
  DeviceScope scope;
  std::string why;
  if (!scope.Enter(device, &why)) return Fail(error, why);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  // Waiting on a stream that is capturing a CUDA graph would invalidate the user's capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!Check(cudaStreamIsCapturing(cuda_stream, &capture), "cudaStreamIsCapturing", error)) {
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) {
    return Fail(error, "the stream is capturing a CUDA graph; not reading slots during capture");
  }
  std::vector<FiniteSlot> host(count);
  // Ordered after the scans queued on the stream; then the wait covers the copy too.
  if (!Check(cudaMemcpyAsync(host.data(), device_slots, count * sizeof(FiniteSlot),
                             cudaMemcpyDeviceToHost, cuda_stream),
             "cudaMemcpyAsync (slots to host)", error) ||
      !Check(cudaStreamSynchronize(cuda_stream), "cudaStreamSynchronize", error)) {
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    out[i].flags = static_cast<uint8_t>(host[i].flags & (kHasNan | kHasPosInf | kHasNegInf));
    out[i].max_abs = BitsToDouble(host[i].max_abs_bits);
  }
  return true;
}

}  // namespace torchrr::kernels
