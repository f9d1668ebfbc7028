// The CPU reference of fingerprint v1 (fingerprint.h), on libxxhash's XXH64.
#include <algorithm>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "torchrr/kernels/fingerprint.h"

namespace torchrr::kernels {
namespace {

// Hashes `bytes` bytes at `data` leaf by leaf into `out` (ceil(bytes / leaf) hashes). The hashes
// are stored little-endian, as the next level reads them (x86-64 and the GPU are little-endian).
void HashLeaves(const unsigned char* data, size_t bytes, std::vector<uint64_t>& out) {
  out.resize((bytes + kFingerprintLeafBytes - 1) / kFingerprintLeafBytes);
  for (size_t i = 0; i < out.size(); ++i) {
    size_t begin = i * kFingerprintLeafBytes;
    size_t length = std::min(kFingerprintLeafBytes, bytes - begin);
    out[i] = XXH64(data + begin, length, 0);
  }
}

}  // namespace

uint64_t FingerprintHost(const void* data, size_t bytes) {
  if (bytes == 0) return XXH64(nullptr, 0, 0);
  const auto* p = static_cast<const unsigned char*>(data);
  if (bytes <= kFingerprintLeafBytes * kFingerprintFanout) {
    // At most 512 leaves: the root hashes their hashes directly, from the stack.
    uint64_t leaves[kFingerprintFanout];
    size_t n = (bytes + kFingerprintLeafBytes - 1) / kFingerprintLeafBytes;
    for (size_t i = 0; i < n; ++i) {
      size_t begin = i * kFingerprintLeafBytes;
      leaves[i] = XXH64(p + begin, std::min(kFingerprintLeafBytes, bytes - begin), 0);
    }
    return XXH64(leaves, n * sizeof(uint64_t), bytes);
  }
  std::vector<uint64_t> level, next;
  HashLeaves(p, bytes, level);
  while (level.size() > kFingerprintFanout) {
    HashLeaves(reinterpret_cast<const unsigned char*>(level.data()),
               level.size() * sizeof(uint64_t), next);
    level.swap(next);
  }
  return XXH64(level.data(), level.size() * sizeof(uint64_t), bytes);
}

}  // namespace torchrr::kernels
