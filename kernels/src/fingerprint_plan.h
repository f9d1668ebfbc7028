// How FingerprintCuda lays out fingerprint v1 (fingerprint.h) of a range as kernel launches, kept
// apart from the CUDA code so that the tests can run the same plan on the CPU.
//
// Two kernels do the work:
//   leaf kernel  one 4-thread group per 4096-byte leaf of its input, any number of leaves, many
//                blocks; writes one hash per leaf to scratch memory.
//   top kernel   one block; either hashes its input's leaves (at most kTopMaxLeaves) into shared
//                memory and then the root over them ("leaves then root"), or the root directly
//                over its input, an array of at most kFingerprintFanout hashes ("root only").
// A range of at most kTopMaxLeaves leaves (1 MiB) is one top-kernel launch ("leaves then root").
// A longer one runs the leaf kernel on the range (level 0), then on level 0's hashes (level 1)...
// while the last level has more than kTopMaxLeaves leaves of hashes; the top kernel finishes:
// "root only" when the last level has at most kFingerprintFanout hashes, else "leaves then root".
// In every case the root is the definition's: over at most 512 hashes, seeded with the range
// length.
#ifndef TORCHRR_KERNELS_FINGERPRINT_PLAN_H_
#define TORCHRR_KERNELS_FINGERPRINT_PLAN_H_

#include <cstdint>

#include "torchrr/kernels/fingerprint.h"

namespace torchrr::kernels {

// 1024 threads, the most a block may have, at 4 threads a leaf.
inline constexpr uint64_t kTopMaxLeaves = 256;
// Stripes loaded per batch in each kernel (xxh64::AccumulateLane). The leaf kernel streams from
// DRAM and needs many bytes in flight: 16 stripes, up to 32 loads of 8 bytes per thread. The top
// kernel runs up to 1024 threads (at most 64 registers each) over data mostly in L2: 8.
inline constexpr int kLeafKernelBatch = 16;
inline constexpr int kTopKernelBatch = 8;
// Levels of leaf-kernel hashes: a range of 2^64 bytes needs 5 (2^52 leaves, / 512 per level down
// to <= 256 leaves of hashes).
inline constexpr int kMaxLevels = 8;
// Level arrays start on 256-byte boundaries of the scratch, so that each 32-byte stripe of a leaf
// is one memory sector.
inline constexpr uint64_t kLevelAlignHashes = 256 / sizeof(uint64_t);

inline constexpr uint64_t LeafCount(uint64_t bytes) {
  return bytes / kFingerprintLeafBytes + (bytes % kFingerprintLeafBytes != 0);
}

struct FingerprintPlan {
  // Leaf-kernel launches, in order: level 0 hashes the range, level i > 0 hashes level i - 1.
  int levels = 0;
  uint64_t level_hashes[kMaxLevels] = {};  // Hashes in level i (= leaves of its input).
  uint64_t level_offset[kMaxLevels] = {};  // Where level i starts in the scratch, in hashes.
  // The top kernel's input: the range (levels == 0) or the last level, `top_input_bytes` long.
  uint64_t top_input_bytes = 0;
  bool top_hashes_leaves = true;  // "Leaves then root"; false: "root only".
  uint64_t result_offset = 0;     // Where the top kernel writes the fingerprint, in hashes.
  uint64_t scratch_hashes = 0;    // Scratch size, in hashes (8 bytes each).
};

// The plan for a range of `bytes` > 0 bytes.
inline FingerprintPlan PlanFingerprint(uint64_t bytes) {
  FingerprintPlan plan;
  uint64_t used = 0;
  uint64_t input_bytes = bytes;
  if (LeafCount(bytes) > kTopMaxLeaves) {
    uint64_t hashes = LeafCount(bytes);
    for (;;) {
      plan.level_hashes[plan.levels] = hashes;
      plan.level_offset[plan.levels] = used;
      used += (hashes + kLevelAlignHashes - 1) / kLevelAlignHashes * kLevelAlignHashes;
      ++plan.levels;
      input_bytes = hashes * sizeof(uint64_t);
      if (LeafCount(input_bytes) <= kTopMaxLeaves) break;
      hashes = LeafCount(input_bytes);
    }
    plan.top_hashes_leaves = plan.level_hashes[plan.levels - 1] > kFingerprintFanout;
  }
  plan.top_input_bytes = input_bytes;
  plan.result_offset = used;
  plan.scratch_hashes = used + 1;
  return plan;
}

}  // namespace torchrr::kernels

#endif  // TORCHRR_KERNELS_FINGERPRINT_PLAN_H_
