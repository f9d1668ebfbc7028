// fingerprint.h's CUDA entry points: fingerprint v1 of device memory at memory bandwidth
// (docs/fingerprint.md). The kernels' arithmetic is xxh64_lanes.h and their launches follow
// fingerprint_plan.h; the tests run both on the CPU against libxxhash.
//
// This file is linked, with a static CUDA runtime, into a library loaded by a PyTorch process whose
// own CUDA runtime already holds the devices' primary contexts; both runtimes share those contexts
// and the streams passed in. So: no context of our own, the calling thread's current context left
// as it was found, no memory from torch's allocator (and none kept beyond a small pool), every
// error returned as text.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_context.h"
#include "fingerprint_plan.h"
#include "torchrr/kernels/fingerprint.h"
#include "xxh64_lanes.h"

namespace torchrr::kernels {
namespace {

using xxh64::kLanes;

// 64 leaves per block of the leaf kernel.
constexpr int kLeafThreads = 256;
constexpr int kTopThreads = static_cast<int>(kTopMaxLeaves) * kLanes;
static_assert(kTopThreads <= 1024, "a block has at most 1024 threads");

// The leaf kernel's and the top kernel's reads of their input, for xxh64::AccumulateLane and
// xxh64::FinishLeaf. Offsets are relative to the leaf.

// Through the read-only data cache; `base` is 8-byte aligned.
struct AlignedGlobalLoad {
  const unsigned char* base;
  __device__ uint64_t U64(uint64_t offset) const {
    return __ldg(reinterpret_cast<const unsigned long long*>(base + offset));
  }
  __device__ uint32_t U32(uint64_t offset) const {
    return __ldg(reinterpret_cast<const unsigned int*>(base + offset));
  }
  __device__ uint8_t U8(uint64_t offset) const { return __ldg(base + offset); }
};

// Byte by byte, for a base that is not 8-byte aligned (a slice of a byte tensor): 8 loads per
// word, slower but correct for any address.
struct BytewiseGlobalLoad {
  const unsigned char* base;
  __device__ uint64_t U64(uint64_t offset) const {
    uint64_t word = 0;
#pragma unroll
    for (int i = 7; i >= 0; --i) word = word << 8 | __ldg(base + offset + i);
    return word;
  }
  __device__ uint32_t U32(uint64_t offset) const {
    uint32_t word = 0;
#pragma unroll
    for (int i = 3; i >= 0; --i) word = word << 8 | __ldg(base + offset + i);
    return word;
  }
  __device__ uint8_t U8(uint64_t offset) const { return __ldg(base + offset); }
};

// Through a generic pointer, 8-byte aligned: the root's input, in shared memory or in a level of
// hashes that an earlier kernel wrote.
struct AlignedGenericLoad {
  const unsigned char* base;
  __device__ uint64_t U64(uint64_t offset) const {
    return *reinterpret_cast<const uint64_t*>(base + offset);
  }
  __device__ uint32_t U32(uint64_t offset) const {
    return *reinterpret_cast<const uint32_t*>(base + offset);
  }
  __device__ uint8_t U8(uint64_t offset) const { return base[offset]; }
};

// XXH64(`length` bytes read by `load`, `seed`), computed by the 4 threads of a group (the 4
// consecutive lanes of a warp named by `group_mask`, all of which must call this), thread `lane`
// running accumulator lane `lane`. The hash is returned to lane 0; the other lanes get 0.
template <int kBatch, typename Load>
__device__ uint64_t HashInGroup(const Load& load, uint64_t length, uint64_t seed, int lane,
                                unsigned group_mask) {
  const unsigned long long acc = xxh64::AccumulateLane<kBatch>(load, length, seed, lane);
  // Width 4: source lane i of this thread's group of 4.
  const uint64_t v0 = __shfl_sync(group_mask, acc, 0, kLanes);
  const uint64_t v1 = __shfl_sync(group_mask, acc, 1, kLanes);
  const uint64_t v2 = __shfl_sync(group_mask, acc, 2, kLanes);
  const uint64_t v3 = __shfl_sync(group_mask, acc, 3, kLanes);
  if (lane != 0) return 0;
  return xxh64::FinishLeaf(v0, v1, v2, v3, load, length, seed);
}

// The mask of the calling thread's group of 4 within its warp (blocks are whole warps).
__device__ unsigned GroupMask() { return 0xFu << (threadIdx.x % 32 & ~3u); }

// hashes[i] = XXH64(leaf i of the `bytes` bytes at `input`, seed 0) for i < leaves, one group of
// The length of the leaf that starts at `begin`: a whole leaf, or the rest of the range.
__device__ __forceinline__ uint64_t LeafLength(uint64_t bytes, uint64_t begin) {
  const uint64_t rest = bytes - begin;
  return rest < kFingerprintLeafBytes ? rest : kFingerprintLeafBytes;
}

// 4 threads per leaf.
template <typename Load>
__global__ void __launch_bounds__(kLeafThreads)
    LeafKernel(const unsigned char* input, uint64_t bytes, uint64_t leaves, uint64_t* hashes) {
  const uint64_t thread = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t leaf = thread / kLanes;
  // The 4 threads of a group share `leaf`, so they leave together and the shuffles stay whole.
  if (leaf >= leaves) return;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const uint64_t begin = leaf * kFingerprintLeafBytes;
  const uint64_t hash = HashInGroup<kLeafKernelBatch>(
      Load{input + begin}, LeafLength(bytes, begin), 0, lane, GroupMask());
  if (lane == 0) hashes[leaf] = hash;
}

// *fingerprint = the root over `input` (`input_bytes` bytes, seed `root_seed`): over the hashes of
// its <= kTopMaxLeaves leaves when `hash_leaves` (computed here into shared memory), else over
// `input` itself (<= kFingerprintFanout hashes, 8-byte aligned). One block.
template <typename Load>
__global__ void __launch_bounds__(kTopThreads)
    TopKernel(const unsigned char* input, uint64_t input_bytes, bool hash_leaves,
              uint64_t root_seed, uint64_t* fingerprint) {
  __shared__ uint64_t leaf_hashes[kTopMaxLeaves];
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const unsigned char* root_input = input;
  uint64_t root_bytes = input_bytes;
  if (hash_leaves) {
    const uint64_t leaves =
        input_bytes / kFingerprintLeafBytes + (input_bytes % kFingerprintLeafBytes != 0);
    // Uniform within a group of 4: all run the same iterations.
    for (uint64_t leaf = threadIdx.x / kLanes; leaf < leaves; leaf += blockDim.x / kLanes) {
      const uint64_t begin = leaf * kFingerprintLeafBytes;
      const uint64_t hash = HashInGroup<kTopKernelBatch>(
          Load{input + begin}, LeafLength(input_bytes, begin), 0, lane, GroupMask());
      if (lane == 0) leaf_hashes[leaf] = hash;
    }
    __syncthreads();
    root_input = reinterpret_cast<const unsigned char*>(leaf_hashes);
    root_bytes = leaves * sizeof(uint64_t);
  }
  if (threadIdx.x < kLanes) {
    const uint64_t hash = HashInGroup<kTopKernelBatch>(AlignedGenericLoad{root_input}, root_bytes,
                                                       root_seed, lane, 0xFu);
    if (lane == 0) *fingerprint = hash;
  }
}

bool Fail(std::string* error, const std::string& message) {
  if (error != nullptr) *error = "torchrr fingerprint: " + message;
  return false;
}

using cuda_context::Describe;

// False, with Describe(rc, what) in *error, when `rc` is an error.
bool Check(cudaError_t rc, const char* what, std::string* error) {
  return rc == cudaSuccess || Fail(error, Describe(rc, what));
}

// Makes `device` current for its lifetime, then puts back the context that was current before
// (cuda_context.h), its failures worded as this file's others.
class DeviceScope {
 public:
  bool Enter(int device, std::string* error) {
    std::string why;
    return scope_.Enter(device, &why) || Fail(error, why);
  }

 private:
  cuda_context::DeviceScope scope_;
};

// A memory pool per device for the scratch (the levels' hashes and the result), so that the
// scratch is neither torch's memory nor re-mapped at every call: up to kPoolKeepBytes stay in the
// pool between calls. Pools live as long as the process: destroying them at exit could run after
// the driver has shut down. Thread-safe.
class ScratchPools {
 public:
  // 8 MiB: the scratch of ranges up to 4 GiB (1/512 of the range, plus the result).
  static constexpr uint64_t kPoolKeepBytes = 8ull << 20;

  // Sets *pool to `device`'s pool, or to nullptr when the device has no memory pools (then the
  // caller falls back on cudaMalloc). `device` must be current.
  cudaError_t Get(int device, cudaMemPool_t* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(device);
    if (it != pools_.end()) {
      *pool = it->second;
      return cudaSuccess;
    }
    int supported = 0;
    cudaError_t rc = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device);
    if (rc != cudaSuccess) return rc;
    cudaMemPool_t created = nullptr;
    if (supported != 0) {
      cudaMemPoolProps props = {};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      rc = cudaMemPoolCreate(&created, &props);
      if (rc != cudaSuccess) return rc;
      uint64_t keep = kPoolKeepBytes;
      rc = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
      if (rc != cudaSuccess) {
        cudaMemPoolDestroy(created);
        return rc;
      }
    }
    pools_.emplace(device, created);
    *pool = created;
    return cudaSuccess;
  }

 private:
  std::mutex mu_;
  std::map<int, cudaMemPool_t> pools_;  // Guarded by mu_.
};

ScratchPools& Pools() {
  static ScratchPools* pools = new ScratchPools;  // Never destroyed: see ScratchPools.
  return *pools;
}

// Scratch memory for one call, stream-ordered on `stream` when the device has a pool. Freed by
// Release() or, on an error path, by the destructor (best effort).
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { Release(); }

  cudaError_t Allocate(cudaMemPool_t pool, uint64_t bytes) {
    pool_ = pool;
    void* memory = nullptr;
    cudaError_t rc = pool != nullptr ? cudaMallocFromPoolAsync(&memory, bytes, pool, stream_)
                                     : cudaMalloc(&memory, bytes);
    if (rc == cudaSuccess) hashes_ = static_cast<uint64_t*>(memory);
    return rc;
  }

  // With a pool, ordered after the work queued on the stream; without one, cudaFree waits for the
  // device to be idle.
  cudaError_t Release() {
    if (hashes_ == nullptr) return cudaSuccess;
    void* memory = hashes_;
    hashes_ = nullptr;
    return pool_ != nullptr ? cudaFreeAsync(memory, stream_) : cudaFree(memory);
  }

  bool stream_ordered() const { return pool_ != nullptr; }
  uint64_t* hashes() const { return hashes_; }

 private:
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  uint64_t* hashes_ = nullptr;
};

// Pinned host memory, mapped into the devices' address space, for the results: the top kernel
// stores the fingerprint straight into host memory, so no copy follows it and the stream
// synchronize is the only wait. One 8-byte slot per call in flight; pages of 512 slots are added
// as concurrent calls need them and live as long as the process (freeing them at exit could run
// after the driver has shut down). Thread-safe.
class ResultSlots {
 public:
  // A slot, or nullptr when no pinned memory could be had (the caller then copies the result).
  uint64_t* Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty() && !unavailable_) {
      void* page = nullptr;
      // Portable: pinned and mapped for every device's context, not only the current one's.
      if (cudaHostAlloc(&page, kPageBytes, cudaHostAllocMapped | cudaHostAllocPortable) !=
          cudaSuccess) {
        cudaGetLastError();
        unavailable_ = true;  // Not retried: a failed pinned allocation is costly to repeat.
      } else {
        for (size_t i = 0; i < kPageBytes / sizeof(uint64_t); ++i) {
          free_.push_back(static_cast<uint64_t*>(page) + i);
        }
      }
    }
    if (free_.empty()) return nullptr;
    uint64_t* slot = free_.back();
    free_.pop_back();
    return slot;
  }

  void Give(uint64_t* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }

 private:
  static constexpr size_t kPageBytes = 4096;
  std::mutex mu_;
  std::vector<uint64_t*> free_;  // Guarded by mu_.
  bool unavailable_ = false;     // Guarded by mu_.
};

ResultSlots& Slots() {
  static ResultSlots* slots = new ResultSlots;  // Never destroyed: see ResultSlots.
  return *slots;
}

// One call's result slot. A slot whose write was queued but not waited for (an error between the
// top kernel's launch and the synchronize) is not given back: 8 bytes lost, rather than a late
// write into a slot that another call is using.
class ResultSlot {
 public:
  ResultSlot() : host_(Slots().Take()) {
    if (host_ != nullptr && cudaHostGetDevicePointer(&device_, host_, 0) != cudaSuccess) {
      cudaGetLastError();
      device_ = nullptr;
    }
  }
  ResultSlot(const ResultSlot&) = delete;
  ResultSlot& operator=(const ResultSlot&) = delete;
  ~ResultSlot() {
    if (host_ != nullptr && !pending_) Slots().Give(host_);
  }

  // Where the top kernel writes; nullptr when there is no slot.
  uint64_t* device() const { return static_cast<uint64_t*>(device_); }
  uint64_t value() const { return *host_; }
  void set_pending(bool pending) { pending_ = pending; }

 private:
  uint64_t* host_;
  void* device_ = nullptr;
  bool pending_ = false;
};

bool LaunchLeafKernel(const unsigned char* input, uint64_t bytes, bool aligned, uint64_t* hashes,
                      cudaStream_t stream, std::string* error) {
  const uint64_t leaves = LeafCount(bytes);
  const uint64_t blocks = (leaves * kLanes + kLeafThreads - 1) / kLeafThreads;
  if (blocks > 0x7fffffffu) return Fail(error, "range too long for one grid");
  const dim3 grid(static_cast<unsigned>(blocks));
  if (aligned) {
    LeafKernel<AlignedGlobalLoad><<<grid, kLeafThreads, 0, stream>>>(input, bytes, leaves, hashes);
  } else {
    LeafKernel<BytewiseGlobalLoad><<<grid, kLeafThreads, 0, stream>>>(input, bytes, leaves, hashes);
  }
  return Check(cudaGetLastError(), "leaf kernel launch", error);
}

bool LaunchTopKernel(const unsigned char* input, uint64_t input_bytes, bool aligned,
                     bool hash_leaves, uint64_t root_seed, uint64_t* fingerprint,
                     cudaStream_t stream, std::string* error) {
  // Whole warps, one group of 4 per leaf; "root only" needs one group.
  const uint64_t groups = hash_leaves ? LeafCount(input_bytes) : 1;
  if (groups > kTopMaxLeaves || (!hash_leaves && input_bytes > kFingerprintLeafBytes)) {
    return Fail(error, "internal: top kernel input of " + std::to_string(input_bytes) +
                           " bytes is too long (plan bug)");
  }
  const int threads = static_cast<int>((groups * kLanes + 31) / 32 * 32);
  if (aligned) {
    TopKernel<AlignedGlobalLoad>
        <<<1, threads, 0, stream>>>(input, input_bytes, hash_leaves, root_seed, fingerprint);
  } else {
    TopKernel<BytewiseGlobalLoad>
        <<<1, threads, 0, stream>>>(input, input_bytes, hash_leaves, root_seed, fingerprint);
  }
  return Check(cudaGetLastError(), "top kernel launch", error);
}

}  // namespace

bool CudaFingerprintAvailable() {
  static const bool available = [] {
    int devices = 0;
    const bool found = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    cudaGetLastError();  // No device is an answer here, not an error for the next call.
    return found;
  }();
  return available;
}

bool FingerprintCuda(const void* device_data, size_t bytes, int device, void* stream,
                     uint64_t* fingerprint, std::string* error) {
  if (fingerprint == nullptr) return Fail(error, "no place for the fingerprint (null)");
  if (device_data == nullptr && bytes != 0) {
    return Fail(error, "null device pointer for a non-empty range");
  }
  // A failed call earlier on this thread leaves its error in the runtime's last-error slot, where
  // the launch checks below would find it.
  cudaGetLastError();

  DeviceScope scope;
  if (!scope.Enter(device, error)) return false;
  // After the device check, so that an absent device fails the same way for every length.
  if (bytes == 0) {
    *fingerprint = FingerprintHost(nullptr, 0);
    return true;
  }
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  // Synchronizing a stream that is capturing a CUDA graph would invalidate the user's capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!Check(cudaStreamIsCapturing(cuda_stream, &capture), "cudaStreamIsCapturing", error)) {
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) {
    return Fail(error, "the stream is capturing a CUDA graph; not fingerprinting during capture");
  }

  const FingerprintPlan plan = PlanFingerprint(bytes);
  ResultSlot slot;
  Scratch scratch(cuda_stream);
  // A range of at most kTopMaxLeaves leaves needs no scratch, unless the result needs a place.
  if (plan.levels > 0 || slot.device() == nullptr) {
    cudaMemPool_t pool = nullptr;
    if (!Check(Pools().Get(device, &pool), "creating the scratch memory pool", error)) {
      return false;
    }
    if (!Check(scratch.Allocate(pool, plan.scratch_hashes * sizeof(uint64_t)),
               "allocating scratch memory", error)) {
      return false;
    }
  }

  const auto* input = static_cast<const unsigned char*>(device_data);
  uint64_t input_bytes = bytes;
  bool aligned = reinterpret_cast<uintptr_t>(device_data) % sizeof(uint64_t) == 0;
  for (int level = 0; level < plan.levels; ++level) {
    uint64_t* hashes = scratch.hashes() + plan.level_offset[level];
    if (!LaunchLeafKernel(input, input_bytes, aligned, hashes, cuda_stream, error)) return false;
    input = reinterpret_cast<const unsigned char*>(hashes);
    input_bytes = plan.level_hashes[level] * sizeof(uint64_t);
    aligned = true;
  }
  uint64_t* result =
      slot.device() != nullptr ? slot.device() : scratch.hashes() + plan.result_offset;
  if (!LaunchTopKernel(input, input_bytes, aligned, plan.top_hashes_leaves, bytes, result,
                       cuda_stream, error)) {
    return false;
  }
  slot.set_pending(true);

  uint64_t copied = 0;
  if (slot.device() == nullptr &&
      !Check(cudaMemcpyAsync(&copied, result, sizeof(copied), cudaMemcpyDeviceToHost, cuda_stream),
             "cudaMemcpyAsync (result to host)", error)) {
    return false;
  }
  if (scratch.stream_ordered() && !Check(scratch.Release(), "cudaFreeAsync (scratch)", error)) {
    return false;
  }
  if (!Check(cudaStreamSynchronize(cuda_stream), "cudaStreamSynchronize", error)) return false;
  slot.set_pending(false);
  if (!Check(scratch.Release(), "cudaFree (scratch)", error)) return false;
  *fingerprint = slot.device() != nullptr ? slot.value() : copied;
  return true;
}

}  // namespace torchrr::kernels
