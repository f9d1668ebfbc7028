// XXH64 taken apart into its four accumulator lanes, so that four GPU threads can hash one leaf
// together and a CPU can run the very same code to check them.
//
// XXH64 (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md) hashes an input of
// `length` bytes with `seed` as follows:
//   1. lanes   when length >= 32, lane k (k = 0..3) starts at LaneInit(seed, k) and consumes the
//              little-endian word at bytes [32 s + 8 k, 32 s + 8 k + 8) of every whole 32-byte
//              stripe s, in order, with Round(); the lanes are independent of each other;
//   2. merge   h = MergeLanes(v0..v3) when length >= 32, else seed + kPrime5; then h += length;
//   3. tail    the last length % 32 bytes: 8-byte words, then one 4-byte word, then single bytes;
//   4. Avalanche(h).
// AccumulateLane() is step 1 for one lane, FinishLeaf() steps 2 to 4. Both read the input through
// a `Load` policy (offsets relative to the leaf's first byte):
//   uint64_t U64(uint64_t offset) const;   // little-endian
//   uint32_t U32(uint64_t offset) const;   // little-endian
//   uint8_t U8(uint64_t offset) const;
// so that the kernel reads device memory with its own loads and the tests read host memory, in the
// same loop. Everything here is plain integer arithmetic; no CUDA types.
#ifndef TORCHRR_KERNELS_XXH64_LANES_H_
#define TORCHRR_KERNELS_XXH64_LANES_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TORCHRR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TORCHRR_HOST_DEVICE inline
#endif
// Unrolled in device code (the loads of a batch must all be issued before their use); the host
// compiler decides for itself.
#if defined(__CUDA_ARCH__)
#define TORCHRR_UNROLL _Pragma("unroll")
#else
#define TORCHRR_UNROLL
#endif

namespace torchrr::kernels::xxh64 {

inline constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

inline constexpr int kLanes = 4;
inline constexpr uint64_t kStripeBytes = 32;
inline constexpr uint64_t kLaneWordBytes = 8;

// `r` is always a constant in 1..63 here.
TORCHRR_HOST_DEVICE uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// One lane consuming one 8-byte word.
TORCHRR_HOST_DEVICE uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = Rotl(acc, 31);
  return acc * kPrime1;
}

TORCHRR_HOST_DEVICE uint64_t MergeRound(uint64_t acc, uint64_t lane) {
  acc ^= Round(0, lane);
  return acc * kPrime1 + kPrime4;
}

// Lane k's starting value: seed + kPrime1 + kPrime2, seed + kPrime2, seed, seed - kPrime1.
TORCHRR_HOST_DEVICE uint64_t LaneInit(uint64_t seed, int lane) {
  return lane == 0   ? seed + kPrime1 + kPrime2
         : lane == 1 ? seed + kPrime2
         : lane == 2 ? seed
                     : seed - kPrime1;
}

// The four lanes' accumulators after the last whole stripe, folded into one value.
TORCHRR_HOST_DEVICE uint64_t MergeLanes(uint64_t v0, uint64_t v1, uint64_t v2, uint64_t v3) {
  uint64_t h = Rotl(v0, 1) + Rotl(v1, 7) + Rotl(v2, 12) + Rotl(v3, 18);
  h = MergeRound(h, v0);
  h = MergeRound(h, v1);
  h = MergeRound(h, v2);
  return MergeRound(h, v3);
}

// The tail steps, one per 8-byte word, 4-byte word and byte left after the whole stripes.
TORCHRR_HOST_DEVICE uint64_t TailWord(uint64_t h, uint64_t word) {
  h ^= Round(0, word);
  return Rotl(h, 27) * kPrime1 + kPrime4;
}

TORCHRR_HOST_DEVICE uint64_t TailHalfWord(uint64_t h, uint32_t half_word) {
  h ^= static_cast<uint64_t>(half_word) * kPrime1;
  return Rotl(h, 23) * kPrime2 + kPrime3;
}

TORCHRR_HOST_DEVICE uint64_t TailByte(uint64_t h, uint8_t byte) {
  h ^= static_cast<uint64_t>(byte) * kPrime5;
  return Rotl(h, 11) * kPrime1;
}

TORCHRR_HOST_DEVICE uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  return h ^ (h >> 32);
}

// Step 1 for lane `lane` of an input of `length` bytes: its accumulator after every whole stripe.
// Loads are issued `kBatch` stripes at a time, and the next batch's loads before the current
// batch's rounds, so that up to 2 * kBatch loads per thread are in flight on a GPU (the rounds of
// one lane form a dependency chain; the loads do not).
template <int kBatch, typename Load>
TORCHRR_HOST_DEVICE uint64_t AccumulateLane(const Load& load, uint64_t length, uint64_t seed,
                                            int lane) {
  uint64_t acc = LaneInit(seed, lane);
  const uint64_t stripes = length / kStripeBytes;
  const uint64_t first = static_cast<uint64_t>(lane) * kLaneWordBytes;
  uint64_t s = 0;
  if (stripes >= static_cast<uint64_t>(kBatch)) {
    uint64_t current[kBatch];
    TORCHRR_UNROLL
    for (int i = 0; i < kBatch; ++i) current[i] = load.U64(first + i * kStripeBytes);
    for (s = kBatch; s + kBatch <= stripes; s += kBatch) {
      uint64_t next[kBatch];
      TORCHRR_UNROLL
      for (int i = 0; i < kBatch; ++i) next[i] = load.U64(first + (s + i) * kStripeBytes);
      TORCHRR_UNROLL
      for (int i = 0; i < kBatch; ++i) acc = Round(acc, current[i]);
      TORCHRR_UNROLL
      for (int i = 0; i < kBatch; ++i) current[i] = next[i];
    }
    TORCHRR_UNROLL
    for (int i = 0; i < kBatch; ++i) acc = Round(acc, current[i]);
  }
  for (; s < stripes; ++s) acc = Round(acc, load.U64(first + s * kStripeBytes));
  return acc;
}

// Steps 2 to 4: the hash of the `length`-byte input from its four lanes' accumulators (ignored
// when length < 32) and its tail, read through `load`.
template <typename Load>
TORCHRR_HOST_DEVICE uint64_t FinishLeaf(uint64_t v0, uint64_t v1, uint64_t v2, uint64_t v3,
                                        const Load& load, uint64_t length, uint64_t seed) {
  uint64_t h = length >= kStripeBytes ? MergeLanes(v0, v1, v2, v3) : seed + kPrime5;
  h += length;
  uint64_t offset = length - length % kStripeBytes;
  for (; offset + 8 <= length; offset += 8) h = TailWord(h, load.U64(offset));
  if (offset + 4 <= length) {
    h = TailHalfWord(h, load.U32(offset));
    offset += 4;
  }
  for (; offset < length; ++offset) h = TailByte(h, load.U8(offset));
  return Avalanche(h);
}

}  // namespace torchrr::kernels::xxh64

#endif  // TORCHRR_KERNELS_XXH64_LANES_H_
