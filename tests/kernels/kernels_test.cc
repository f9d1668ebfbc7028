// kernels_test: storage fingerprints (fingerprint.h).
//   - FingerprintHost against a plain statement of the v1 definition, and pinned golden values;
//   - the CUDA kernels' arithmetic (xxh64_lanes.h) and launch plan (fingerprint_plan.h) run on the
//     CPU, checked against libxxhash and FingerprintHost: what can be checked of the GPU path
//     without a GPU;
//   - with a CUDA device, FingerprintCuda against FingerprintHost (skipped, saying why, without).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

#ifdef TORCHRR_KERNELS_CUDA
#include <cuda_runtime.h>
#endif

#include "fingerprint_plan.h"
#include "torchrr/kernels/fingerprint.h"
#include "xxh64_lanes.h"

namespace torchrr::kernels {
namespace {

constexpr size_t kLeaf = 4096;
constexpr size_t kMiB = 1 << 20;

std::vector<unsigned char> RandomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<unsigned char> data(bytes);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t word = random();
    std::memcpy(&data[i], &word, 8);
  }
  for (; i < bytes; ++i) data[i] = static_cast<unsigned char>(random());
  return data;
}

// ---------------------------------------------------------------------------------------------
// Fingerprint v1 as fingerprint.h defines it, written as plainly as possible.

std::vector<uint64_t> HashEachLeaf(const unsigned char* data, size_t bytes) {
  std::vector<uint64_t> hashes;
  for (size_t begin = 0; begin < bytes; begin += kLeaf) {
    hashes.push_back(XXH64(data + begin, std::min(kLeaf, bytes - begin), 0));
  }
  return hashes;
}

std::vector<unsigned char> LittleEndian(const std::vector<uint64_t>& hashes) {
  std::vector<unsigned char> bytes;
  for (uint64_t hash : hashes) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<unsigned char>(hash >> (8 * i)));
  }
  return bytes;
}

// The root over `hashes`, hashing them again first while there are more than 512.
uint64_t Root(const std::vector<uint64_t>& hashes, size_t range_bytes) {
  const std::vector<unsigned char> bytes = LittleEndian(hashes);
  if (hashes.size() > 512) return Root(HashEachLeaf(bytes.data(), bytes.size()), range_bytes);
  return XXH64(bytes.data(), bytes.size(), range_bytes);
}

uint64_t DefinitionFingerprint(const unsigned char* data, size_t bytes) {
  if (bytes == 0) return XXH64("", 0, 0);
  return Root(HashEachLeaf(data, bytes), bytes);
}

// Lengths around every boundary of the definition: the 32-byte stripe, the 4 KiB leaf, the
// 512-hash root (2 MiB), the GPU plan's 256-leaf top kernel (1 MiB), and a second level of hashes
// with a "leaves then root" top (5 MiB + 7: 1281 leaves).
const std::vector<size_t> kSizes = {
    0, 1, 3, 7, 8, 31, 32, 33, 63, 64, 100, 4095, 4096, 4097, 8191, 8192, 12345,
    256 * kLeaf - 1, 256 * kLeaf, 256 * kLeaf + 1, 257 * kLeaf,
    512 * kLeaf - 1, 512 * kLeaf, 512 * kLeaf + 1, 513 * kLeaf, 5 * kMiB + 7};

TEST(FingerprintHostTest, EqualsTheDefinitionForManySizesAndAlignments) {
  const std::vector<unsigned char> data = RandomBytes(5 * kMiB + 64, 1);
  for (size_t bytes : kSizes) {
    for (size_t offset : {0, 1, 3, 4, 8}) {
      const unsigned char* p = data.data() + offset;
      EXPECT_EQ(FingerprintHost(p, bytes), DefinitionFingerprint(p, bytes))
          << bytes << " bytes at offset " << offset;
    }
  }
}

TEST(FingerprintHostTest, SeesSingleByteChanges) {
  std::vector<unsigned char> data = RandomBytes(512 * kLeaf + 1, 2);
  const uint64_t before = FingerprintHost(data.data(), data.size());
  // The first byte, a leaf's last, a tail byte of the last leaf, and the last byte.
  for (size_t at : {size_t{0}, kLeaf - 1, 300 * kLeaf + 17, data.size() - 1}) {
    data[at] ^= 0x01;
    EXPECT_NE(FingerprintHost(data.data(), data.size()), before) << "byte " << at;
    data[at] ^= 0x01;
  }
  EXPECT_EQ(FingerprintHost(data.data(), data.size()), before);
}

TEST(FingerprintHostTest, RootIsSeededWithTheLength) {
  // One leaf: the fingerprint is the root over its one hash, seeded with the length.
  const std::vector<unsigned char> zeros(kLeaf, 0);
  const uint64_t leaf = XXH64(zeros.data(), kLeaf, 0);
  EXPECT_EQ(FingerprintHost(zeros.data(), kLeaf), XXH64(&leaf, sizeof(leaf), kLeaf));
  EXPECT_NE(FingerprintHost(zeros.data(), kLeaf), XXH64(&leaf, sizeof(leaf), 0));
  EXPECT_NE(FingerprintHost(zeros.data(), kLeaf), leaf);
}

// Fixed values: a change to the definition, the CPU reference or libxxhash's XXH64 fails here.
// They were computed by this code and, independently, by a pure-Python XXH64 and definition.
TEST(FingerprintHostTest, GoldenValues) {
  EXPECT_EQ(FingerprintHost(nullptr, 0), 0xEF46DB3751D8E999ull);  // XXH64("", 0)
  auto pattern = [](size_t bytes) {
    std::vector<unsigned char> data(bytes);
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
    return data;
  };
  struct Golden {
    size_t bytes;
    uint64_t fingerprint;
  };
  for (const Golden& g : std::vector<Golden>{
           {1, 0x2bd61d69b2d5b113ull},
           {31, 0x4768f4f61cff4bf4ull},
           {4096, 0xb34a8333d91f6e62ull},
           {4097, 0xcc9ca21077901509ull},
           {512 * kLeaf + 1, 0xd150e1ca1bd0f6edull},
           {3 * kMiB + 5, 0xd0ac86d7b26100b9ull},
       }) {
    const std::vector<unsigned char> data = pattern(g.bytes);
    EXPECT_EQ(FingerprintHost(data.data(), g.bytes), g.fingerprint)
        << "pattern of " << g.bytes << " bytes";
  }
  const std::vector<unsigned char> zeros(64 * 1024, 0);
  EXPECT_EQ(FingerprintHost(zeros.data(), zeros.size()), 0x5645cd70d40d2d8eull)
      << "64 KiB of zeros";
}

// ---------------------------------------------------------------------------------------------
// The GPU path on the CPU: the kernels' lane arithmetic and launch plan.

// Host memory, read little-endian byte by byte, at any alignment.
struct HostLoad {
  const unsigned char* base;
  uint64_t U64(uint64_t offset) const {
    uint64_t word = 0;
    for (int i = 7; i >= 0; --i) word = word << 8 | base[offset + i];
    return word;
  }
  uint32_t U32(uint64_t offset) const {
    uint32_t word = 0;
    for (int i = 3; i >= 0; --i) word = word << 8 | base[offset + i];
    return word;
  }
  uint8_t U8(uint64_t offset) const { return base[offset]; }
};

// What one group of 4 threads computes (fingerprint.cu's HashInGroup): the 4 lanes one by one,
// then lane 0's merge, tail and avalanche.
template <int kBatch>
uint64_t GroupHash(const unsigned char* data, uint64_t length, uint64_t seed) {
  const HostLoad load{data};
  uint64_t lane[xxh64::kLanes];
  for (int k = 0; k < xxh64::kLanes; ++k) {
    lane[k] = xxh64::AccumulateLane<kBatch>(load, length, seed, k);
  }
  return xxh64::FinishLeaf(lane[0], lane[1], lane[2], lane[3], load, length, seed);
}

template <int kBatch>
void ExpectGroupHashIsXxh64(const std::vector<unsigned char>& data) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{4097}, uint64_t{0x9E3779B97F4A7C15}}) {
    for (size_t offset : {0, 3}) {
      for (size_t length = 0; length <= kLeaf; ++length) {
        const unsigned char* p = data.data() + offset;
        ASSERT_EQ(GroupHash<kBatch>(p, length, seed), XXH64(p, length, seed))
            << "batch " << kBatch << ", length " << length << ", seed " << seed << ", offset "
            << offset;
      }
    }
  }
}

TEST(LaneDecompositionTest, FourLanesMergedEqualXxh64ForEveryLeafLength) {
  const std::vector<unsigned char> data = RandomBytes(kLeaf + 8, 3);
  ExpectGroupHashIsXxh64<kLeafKernelBatch>(data);
  ExpectGroupHashIsXxh64<kTopKernelBatch>(data);
  // Batches that do not divide the 128 stripes of a leaf.
  ExpectGroupHashIsXxh64<1>(data);
  ExpectGroupHashIsXxh64<3>(data);
}

TEST(LaneDecompositionTest, StepsMatchTheXxh64Constants) {
  // XXH64 of 32 zero bytes is the four lanes' merge of Round(init, 0), with no tail.
  const unsigned char zeros[32] = {};
  uint64_t v[4];
  for (int k = 0; k < 4; ++k) v[k] = xxh64::Round(xxh64::LaneInit(0, k), 0);
  EXPECT_EQ(xxh64::Avalanche(xxh64::MergeLanes(v[0], v[1], v[2], v[3]) + 32),
            XXH64(zeros, 32, 0));
  EXPECT_EQ(xxh64::Avalanche(xxh64::kPrime5), XXH64("", 0, 0));
}

// What FingerprintCuda computes, launch by launch, with the group of 4 threads run on the CPU.
uint64_t EmulateFingerprintCuda(const unsigned char* data, uint64_t bytes) {
  if (bytes == 0) return FingerprintHost(nullptr, 0);
  const FingerprintPlan plan = PlanFingerprint(bytes);
  // Filled with a pattern, so that a read of an unwritten hash changes the result.
  std::vector<uint64_t> scratch(plan.scratch_hashes, 0x5A5A5A5A5A5A5A5Aull);
  const unsigned char* input = data;
  uint64_t input_bytes = bytes;
  for (int level = 0; level < plan.levels; ++level) {
    EXPECT_EQ(LeafCount(input_bytes), plan.level_hashes[level]);
    for (uint64_t leaf = 0; leaf < plan.level_hashes[level]; ++leaf) {
      const uint64_t begin = leaf * kLeaf;
      scratch[plan.level_offset[level] + leaf] = GroupHash<kLeafKernelBatch>(
          input + begin, std::min<uint64_t>(kLeaf, input_bytes - begin), 0);
    }
    input = reinterpret_cast<const unsigned char*>(&scratch[plan.level_offset[level]]);
    input_bytes = plan.level_hashes[level] * sizeof(uint64_t);
  }
  EXPECT_EQ(input_bytes, plan.top_input_bytes);
  std::vector<uint64_t> leaf_hashes;  // The top kernel's shared memory.
  if (plan.top_hashes_leaves) {
    EXPECT_LE(LeafCount(input_bytes), kTopMaxLeaves);
    for (uint64_t begin = 0; begin < input_bytes; begin += kLeaf) {
      leaf_hashes.push_back(GroupHash<kTopKernelBatch>(
          input + begin, std::min<uint64_t>(kLeaf, input_bytes - begin), 0));
    }
    input = reinterpret_cast<const unsigned char*>(leaf_hashes.data());
    input_bytes = leaf_hashes.size() * sizeof(uint64_t);
  }
  EXPECT_LE(input_bytes, kFingerprintLeafBytes);
  scratch[plan.result_offset] = GroupHash<kTopKernelBatch>(input, input_bytes, bytes);
  return scratch[plan.result_offset];
}

TEST(CudaPlanTest, EmulatedKernelsEqualFingerprintHost) {
  const std::vector<unsigned char> data = RandomBytes(5 * kMiB + 64, 4);
  for (size_t bytes : kSizes) {
    for (size_t offset : {0, 5}) {
      const unsigned char* p = data.data() + offset;
      EXPECT_EQ(EmulateFingerprintCuda(p, bytes), FingerprintHost(p, bytes))
          << bytes << " bytes at offset " << offset;
    }
  }
}

// The plan's chain of hash arrays, for ranges too long to emulate, against the definition's: the
// leaves of the range, then the leaves of each array of hashes while it has more than 512.
TEST(CudaPlanTest, LevelsFollowTheDefinitionUpTo2To64Bytes) {
  std::vector<uint64_t> lengths;
  for (int shift = 0; shift < 64; ++shift) {
    const uint64_t power = uint64_t{1} << shift;
    for (uint64_t delta : {uint64_t{0}, uint64_t{1}, uint64_t{5}}) {
      lengths.push_back(power + delta);
      if (power > delta) lengths.push_back(power - delta);
    }
  }
  for (uint64_t leaves : {256, 257, 512, 513, 512 * 256, 512 * 256 + 1, 512 * 512, 512 * 512 + 1}) {
    lengths.push_back(leaves * kLeaf);
    lengths.push_back(leaves * kLeaf + 1);
  }
  lengths.push_back(~uint64_t{0});
  for (uint64_t bytes : lengths) {
    if (bytes == 0) continue;
    SCOPED_TRACE(bytes);
    std::vector<uint64_t> definition = {LeafCount(bytes)};
    while (definition.back() > kFingerprintFanout) {
      definition.push_back(LeafCount(definition.back() * sizeof(uint64_t)));
    }

    const FingerprintPlan plan = PlanFingerprint(bytes);
    ASSERT_GE(plan.levels, 0);
    ASSERT_LE(plan.levels, kMaxLevels);
    std::vector<uint64_t> planned(plan.level_hashes, plan.level_hashes + plan.levels);
    if (plan.top_hashes_leaves) {
      ASSERT_LE(LeafCount(plan.top_input_bytes), kTopMaxLeaves);
      planned.push_back(LeafCount(plan.top_input_bytes));
    } else {
      ASSERT_GE(plan.levels, 1);
      ASSERT_EQ(plan.top_input_bytes, plan.level_hashes[plan.levels - 1] * sizeof(uint64_t));
    }
    EXPECT_EQ(planned, definition);

    // Levels lie in the scratch in order, aligned, without overlap, and before the result.
    uint64_t end = 0;
    for (int level = 0; level < plan.levels; ++level) {
      EXPECT_GE(plan.level_offset[level], end);
      EXPECT_EQ(plan.level_offset[level] % kLevelAlignHashes, 0u);
      end = plan.level_offset[level] + plan.level_hashes[level];
    }
    EXPECT_GE(plan.result_offset, end);
    EXPECT_LT(plan.result_offset, plan.scratch_hashes);
  }
}

// ---------------------------------------------------------------------------------------------
// FingerprintCuda on a device.

TEST(CudaFingerprintTest, FailsWithAReasonWithoutADevice) {
  if (CudaFingerprintAvailable()) GTEST_SKIP() << "a CUDA device is present";
  const uint64_t word = 0;
  for (size_t bytes : {size_t{0}, sizeof(word)}) {
    uint64_t fingerprint = 0;
    std::string error;
    EXPECT_FALSE(FingerprintCuda(&word, bytes, 0, nullptr, &fingerprint, &error));
    EXPECT_NE(error, "");
  }
}

#ifdef TORCHRR_KERNELS_CUDA

// Device memory for the test, with a copy of its content on the host.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::vector<unsigned char> host) : host_(std::move(host)) {
    if (cudaMalloc(&device_, host_.size()) != cudaSuccess) {
      device_ = nullptr;
      return;
    }
    if (cudaMemcpy(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      cudaFree(device_);
      device_ = nullptr;
    }
  }
  ~DeviceBytes() { cudaFree(device_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  bool ok() const { return device_ != nullptr; }
  const unsigned char* device() const { return static_cast<const unsigned char*>(device_); }
  const unsigned char* host() const { return host_.data(); }

  // Flips one bit of byte `at`, on both sides.
  bool Flip(size_t at) {
    host_[at] ^= 0x01;
    return cudaMemcpy(static_cast<unsigned char*>(device_) + at, &host_[at], 1,
                      cudaMemcpyHostToDevice) == cudaSuccess;
  }

 private:
  std::vector<unsigned char> host_;
  void* device_ = nullptr;
};

class CudaFingerprintDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaFingerprintAvailable()) {
      GTEST_SKIP() << "no CUDA device (or no usable driver): FingerprintCuda is not checked here";
    }
    ASSERT_EQ(cudaGetDevice(&device_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // FingerprintCuda of `bytes` at `p`; fails the test (returning 0) when it fails.
  uint64_t OnDevice(const unsigned char* p, size_t bytes, cudaStream_t stream) {
    uint64_t fingerprint = 0;
    std::string error;
    EXPECT_TRUE(FingerprintCuda(p, bytes, device_, stream, &fingerprint, &error)) << error;
    return fingerprint;
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaFingerprintDeviceTest, EqualsFingerprintHost) {
  std::vector<size_t> sizes = kSizes;
  sizes.push_back(64 * kMiB + 3);
  DeviceBytes data(RandomBytes(64 * kMiB + 3 + 64, 5));
  ASSERT_TRUE(data.ok());
  for (size_t bytes : sizes) {
    for (size_t offset : {0, 1, 4, 8, 13}) {
      EXPECT_EQ(OnDevice(data.device() + offset, bytes, stream_),
                FingerprintHost(data.host() + offset, bytes))
          << bytes << " bytes at offset " << offset;
    }
  }
  // The legacy default stream.
  EXPECT_EQ(OnDevice(data.device(), 5 * kMiB + 7, nullptr),
            FingerprintHost(data.host(), 5 * kMiB + 7));
}

TEST_F(CudaFingerprintDeviceTest, ThreeLevelsOfHashesEqualFingerprintHost) {
  // 512 * 512 leaves and 5 bytes: 262145 leaf hashes, 513 hashes of those, then 2.
  const size_t bytes = 512 * 512 * kLeaf + 5;
  DeviceBytes data(RandomBytes(bytes + 8, 6));
  ASSERT_TRUE(data.ok()) << "could not allocate and fill " << bytes << " bytes";
  EXPECT_EQ(OnDevice(data.device(), bytes, stream_), FingerprintHost(data.host(), bytes));
  EXPECT_EQ(OnDevice(data.device() + 3, bytes, stream_), FingerprintHost(data.host() + 3, bytes));
}

TEST_F(CudaFingerprintDeviceTest, SeesASingleByteChange) {
  const size_t bytes = 64 * kMiB + 3;
  DeviceBytes data(RandomBytes(bytes, 7));
  ASSERT_TRUE(data.ok());
  const uint64_t before = OnDevice(data.device(), bytes, stream_);
  for (size_t at : {size_t{0}, 12345 * kLeaf + 100, bytes - 1}) {
    ASSERT_TRUE(data.Flip(at));
    const uint64_t after = OnDevice(data.device(), bytes, stream_);
    EXPECT_NE(after, before) << "byte " << at;
    EXPECT_EQ(after, FingerprintHost(data.host(), bytes)) << "byte " << at;
    ASSERT_TRUE(data.Flip(at));
  }
  EXPECT_EQ(OnDevice(data.device(), bytes, stream_), before);
}

TEST_F(CudaFingerprintDeviceTest, ConcurrentCallsFromManyThreads) {
  // Calls in flight at once share the scratch pool and the result slots.
  DeviceBytes data(RandomBytes(8 * kMiB + 64, 9));
  ASSERT_TRUE(data.ok());
  const std::vector<size_t> sizes = {100, 4097, kMiB + 3, 3 * kMiB, 8 * kMiB};
  std::vector<uint64_t> expected;
  for (size_t bytes : sizes) expected.push_back(FingerprintHost(data.host() + 1, bytes));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (t % 2 == 1 && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++mismatches;
        return;
      }
      for (int i = 0; i < 50; ++i) {
        const size_t which = (t + i) % sizes.size();
        uint64_t fingerprint = 0;
        std::string error;
        if (!FingerprintCuda(data.device() + 1, sizes[which], device_, stream, &fingerprint,
                             &error) ||
            fingerprint != expected[which]) {
          ++mismatches;
        }
      }
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(CudaFingerprintDeviceTest, LeavesTheCurrentDeviceAndReportsBadArguments) {
  DeviceBytes data(RandomBytes(4096, 8));
  ASSERT_TRUE(data.ok());
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  uint64_t fingerprint = 0;
  std::string error;
  EXPECT_FALSE(FingerprintCuda(data.device(), 4096, devices, stream_, &fingerprint, &error));
  EXPECT_NE(error, "");
  EXPECT_FALSE(FingerprintCuda(nullptr, 4096, device_, stream_, &fingerprint, &error));
  EXPECT_TRUE(FingerprintCuda(nullptr, 0, device_, stream_, &fingerprint, &error)) << error;
  EXPECT_EQ(fingerprint, FingerprintHost(nullptr, 0));
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, device_);
  // The failures above left no error behind for the next call.
  EXPECT_EQ(OnDevice(data.device(), 4096, stream_), FingerprintHost(data.host(), 4096));
}

#else

TEST(CudaFingerprintDeviceTest, EqualsFingerprintHost) {
  GTEST_SKIP() << "this build has no CUDA (no nvcc found, or TORCHRR_WITH_CUDA=OFF)";
}

#endif  // TORCHRR_KERNELS_CUDA

}  // namespace
}  // namespace torchrr::kernels
