// Storage fingerprints: a 64-bit hash of a byte range, to catch writes that no version counter
// sees (a raw kernel on data_ptr, a write through numpy or .data, a custom extension).
//
// The hash is defined so that a GPU can compute it at memory bandwidth and a CPU gives the same
// value ("fingerprint v1"; docs/fingerprint.md):
//   leaves   the range is cut into 4096-byte leaves (the last may be shorter); each leaf's hash is
//            XXH64(leaf bytes, seed 0);
//   levels   while there are more than 512 hashes, the array of hashes (little-endian u64) is
//            hashed again the same way: 4096-byte leaves of it, XXH64 with seed 0;
//   root     the fingerprint is XXH64(the remaining <= 512 hashes as bytes, seed = range length).
// The empty range has fingerprint XXH64("", seed 0).
//
// This header has no CUDA types: the CPU build has the whole feature, and the CUDA one is a
// second implementation of the same function that tests compare against the CPU one.
#ifndef TORCHRR_KERNELS_FINGERPRINT_H_
#define TORCHRR_KERNELS_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchrr::kernels {

inline constexpr size_t kFingerprintLeafBytes = 4096;
inline constexpr size_t kFingerprintFanout = kFingerprintLeafBytes / sizeof(uint64_t);

// The fingerprint of `bytes` bytes at `data` (host memory), on the calling thread. Any alignment.
// Thread-safe; allocates only for ranges over 2 MiB (the hashes of the leaves).
uint64_t FingerprintHost(const void* data, size_t bytes);

// True when this build has the CUDA implementation and a CUDA device is present. Never throws;
// the first call may initialize the CUDA runtime.
bool CudaFingerprintAvailable();

// The fingerprint of `bytes` bytes at `device_data` (memory of CUDA device `device`), computed
// on `stream` (a cudaStream_t; nullptr for the legacy default stream) after the work already
// queued there, and waited for. Returns false and sets *error when the build has no CUDA, the
// device is absent, or a CUDA call fails; never throws. Thread-safe.
bool FingerprintCuda(const void* device_data, size_t bytes, int device, void* stream,
                     uint64_t* fingerprint, std::string* error);

}  // namespace torchrr::kernels

#endif  // TORCHRR_KERNELS_FINGERPRINT_H_
