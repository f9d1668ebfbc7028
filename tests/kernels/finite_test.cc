// kernels_test: finiteness scans (finite.h).
//   - ScanFiniteReference against known values of each format (its decoding of float16 and
//     bfloat16 by hand included), and finite_view.h's conversions and view merging;
//   - ScanFiniteHost against ScanFiniteReference: planted NaN and infinities, finite extremes,
//     random bit patterns, lengths around the vector width, and views that are not contiguous;
//   - the CUDA kernels' walks over a view (finite_view.h) run on the CPU;
//   - with a CUDA device, ScanFiniteCudaAsync and ReadFiniteSlotsCuda against the reference
//     (skipped, saying why, without).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#ifdef TORCHRR_KERNELS_CUDA
#include <cuda_runtime.h>
#endif

#include "finite_view.h"
#include "torchrr/kernels/finite.h"

namespace torchrr::kernels {
namespace {

// A format's bit patterns and extremes, written out here independently of finite_view.h.
struct Format {
  FloatKind kind;
  const char* name;
  int bytes;
  uint64_t sign;
  uint64_t inf;
  uint64_t quiet_nan;
  uint64_t one;
  uint64_t max_finite;
  double max_finite_value;
  double min_subnormal_value;  // Of bits 1.
};

const Format kFormats[] = {
    {FloatKind::kFloat16, "float16", 2, 0x8000, 0x7c00, 0x7e00, 0x3c00, 0x7bff, 65504.0, 0x1p-24},
    {FloatKind::kBFloat16, "bfloat16", 2, 0x8000, 0x7f80, 0x7fc0, 0x3f80, 0x7f7f, 0x1.fep127,
     0x1p-133},
    {FloatKind::kFloat32, "float32", 4, 0x80000000u, 0x7f800000u, 0x7fc00000u, 0x3f800000u,
     0x7f7fffffu, FLT_MAX, 0x1p-149},
    {FloatKind::kFloat64, "float64", 8, 0x8000000000000000ull, 0x7ff0000000000000ull,
     0x7ff8000000000000ull, 0x3ff0000000000000ull, 0x7fefffffffffffffull, DBL_MAX, 0x1p-1074},
};

// A host array of `f`'s elements, set and read as bit patterns.
class Elements {
 public:
  Elements(const Format& f, size_t count, uint64_t fill = 0) : format_(f), bytes_(count * f.bytes) {
    for (size_t i = 0; i < count; ++i) Set(i, fill);
  }
  void Set(size_t i, uint64_t bits) {
    std::memcpy(&bytes_[i * format_.bytes], &bits, format_.bytes);  // Little-endian.
  }
  uint64_t Get(size_t i) const {
    uint64_t bits = 0;
    std::memcpy(&bits, &bytes_[i * format_.bytes], format_.bytes);
    return bits;
  }
  const void* at(int64_t i) const { return bytes_.data() + i * format_.bytes; }
  size_t count() const { return bytes_.size() / format_.bytes; }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  Format format_;
  std::vector<unsigned char> bytes_;
};

// Random bit patterns, NaNs and infinities among them.
uint64_t RandomBits(const Format& f, std::mt19937_64& random) {
  return random() & (f.bytes == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * f.bytes)) - 1);
}

// Random finite values over the whole range, subnormals and both zeros among them: a non-finite
// pattern loses its exponent's top bit.
uint64_t RandomFinite(const Format& f, std::mt19937_64& random) {
  const uint64_t bits = RandomBits(f, random);
  return (bits & ~f.sign) >= f.inf ? bits & ~(f.sign >> 1) : bits;
}

Elements RandomFiniteElements(const Format& f, size_t count, uint64_t seed) {
  std::mt19937_64 random(seed);
  Elements elements(f, count);
  for (size_t i = 0; i < count; ++i) elements.Set(i, RandomFinite(f, random));
  return elements;
}

// "nan|+inf|-inf max 0x1.ffcp+15": exact, for messages that show what differs.
std::string Describe(const FiniteScan& scan) {
  std::string text;
  if (scan.flags & kHasNan) text += "nan|";
  if (scan.flags & kHasPosInf) text += "+inf|";
  if (scan.flags & kHasNegInf) text += "-inf|";
  if (scan.flags & ~(kHasNan | kHasPosInf | kHasNegInf)) text += "unknown flags|";
  char max[64];
  std::snprintf(max, sizeof(max), "max %a", scan.max_abs);
  return text + max;
}

FiniteScan Scan(uint8_t flags, double max_abs) {
  FiniteScan scan;
  scan.flags = flags;
  scan.max_abs = max_abs;
  return scan;
}

// ScanFiniteHost of the view, after checking that it equals ScanFiniteReference's.
FiniteScan HostScan(const void* data, const Format& f, const std::vector<int64_t>& sizes,
                    const std::vector<int64_t>& strides) {
  const int dims = static_cast<int>(sizes.size());
  const FiniteScan host = ScanFiniteHost(data, f.kind, sizes.data(), strides.data(), dims);
  const FiniteScan reference =
      ScanFiniteReference(data, f.kind, sizes.data(), strides.data(), dims);
  EXPECT_EQ(Describe(host), Describe(reference)) << f.name << ": ScanFiniteHost != reference";
  return host;
}

// Contiguous 1-D.
FiniteScan HostScan(const Elements& elements, const Format& f) {
  return HostScan(elements.at(0), f, {static_cast<int64_t>(elements.count())}, {1});
}

// ---------------------------------------------------------------------------------------------
// The reference and the shared helpers, against values known independently.

TEST(FiniteReferenceTest, KnownValuesOfEachFormat) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    // 1, -max, the smallest subnormal, -0.
    Elements values(f, 4);
    values.Set(0, f.one);
    values.Set(1, f.sign | f.max_finite);
    values.Set(2, 1);
    values.Set(3, f.sign);
    const int64_t size = 4, stride = 1;
    EXPECT_EQ(Describe(ScanFiniteReference(values.at(0), f.kind, &size, &stride, 1)),
              Describe(Scan(0, f.max_finite_value)));
    const int64_t subnormals = 2;
    EXPECT_EQ(Describe(ScanFiniteReference(values.at(2), f.kind, &subnormals, &stride, 1)),
              Describe(Scan(0, f.min_subnormal_value)));
    EXPECT_EQ(Describe(ScanFiniteReference(values.at(0), f.kind, nullptr, nullptr, 0)),
              Describe(Scan(0, 1.0)))
        << "a scalar";

    struct Case {
      uint64_t bits;
      uint8_t flags;
    };
    for (const Case& c :
         {Case{f.inf, kHasPosInf}, Case{f.sign | f.inf, kHasNegInf}, Case{f.quiet_nan, kHasNan},
          Case{f.sign | f.quiet_nan, kHasNan}, Case{f.inf | 1, kHasNan} /* signaling */}) {
      Elements one(f, 1, c.bits);
      EXPECT_EQ(Describe(ScanFiniteReference(one.at(0), f.kind, nullptr, nullptr, 0)),
                Describe(Scan(c.flags, 0)))
          << std::hex << c.bits;
    }
  }
}

TEST(FiniteViewTest, HalfAndBFloat16ConvertExactly) {
  EXPECT_EQ(HalfToDouble(0x3c00), 1.0);
  EXPECT_EQ(HalfToDouble(0xc000), -2.0);
  EXPECT_EQ(HalfToDouble(0x7bff), 65504.0);
  EXPECT_EQ(HalfToDouble(0x0400), 0x1p-14);  // Smallest normal.
  EXPECT_EQ(HalfToDouble(0x03ff), 1023 * 0x1p-24);
  EXPECT_EQ(HalfToDouble(0x0001), 0x1p-24);
  EXPECT_EQ(HalfToDouble(0x3555), 0x1.554p-2);
  EXPECT_TRUE(std::signbit(HalfToDouble(0x8000)));
  EXPECT_EQ(HalfToDouble(0x8000), 0.0);
  EXPECT_EQ(HalfToDouble(0x7c00), INFINITY);
  EXPECT_EQ(HalfToDouble(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(HalfToDouble(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToDouble(0x7c01)));
  EXPECT_EQ(BFloat16ToDouble(0x3f80), 1.0);
  EXPECT_EQ(BFloat16ToDouble(0x7f7f), 0x1.fep127);
  EXPECT_EQ(BFloat16ToDouble(0x0001), 0x1p-133);
  EXPECT_EQ(BFloat16ToDouble(0xff80), -INFINITY);
  EXPECT_TRUE(std::isnan(BFloat16ToDouble(0x7fc0)));
}

struct Merged {
  int64_t offset;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool operator==(const Merged&) const = default;
  friend void PrintTo(const Merged& m, std::ostream* os) {
    *os << "offset " << m.offset << ", sizes " << ::testing::PrintToString(m.sizes) << ", strides "
        << ::testing::PrintToString(m.strides);
  }
};

Merged MergeOf(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  MergedView view;
  EXPECT_TRUE(MergeView(sizes.data(), strides.data(), static_cast<int>(sizes.size()), &view));
  EXPECT_FALSE(view.empty);
  return {view.offset, std::vector<int64_t>(view.sizes, view.sizes + view.dims),
          std::vector<int64_t>(view.strides, view.strides + view.dims)};
}

TEST(FiniteViewTest, MergeViewReachesTheSameElementsInFewerDims) {
  // Contiguous, in any shape or permutation: one run.
  EXPECT_EQ(MergeOf({2, 3, 4}, {12, 4, 1}), (Merged{0, {24}, {1}}));
  EXPECT_EQ(MergeOf({4, 3}, {1, 4}), (Merged{0, {12}, {1}})) << "transposed";
  EXPECT_EQ(MergeOf({3, 2, 4}, {4, 12, 1}), (Merged{0, {24}, {1}})) << "permuted";
  // Size 1 and broadcast dims are dropped.
  EXPECT_EQ(MergeOf({1, 5, 1}, {99, 1, 7}), (Merged{0, {5}, {1}}));
  EXPECT_EQ(MergeOf({6, 5}, {0, 1}), (Merged{0, {5}, {1}})) << "expanded rows";
  EXPECT_EQ(MergeOf({6, 5}, {1, 0}), (Merged{0, {6}, {1}})) << "expanded columns";
  EXPECT_EQ(MergeOf({3, 3}, {0, 0}), (Merged{0, {}, {}})) << "one element, broadcast";
  EXPECT_EQ(MergeOf({}, {}), (Merged{0, {}, {}})) << "a scalar";
  // A slice of rows stays two dims; every other element stays strided.
  EXPECT_EQ(MergeOf({4, 5}, {10, 1}), (Merged{0, {4, 5}, {10, 1}}));
  EXPECT_EQ(MergeOf({4, 5}, {12, 2}), (Merged{0, {4, 5}, {12, 2}}));
  EXPECT_EQ(MergeOf({4, 5}, {10, 2}), (Merged{0, {20}, {2}})) << "every other of rows of 10";
  EXPECT_EQ(MergeOf({4, 5}, {5, 2}), (Merged{0, {4, 5}, {5, 2}})) << "overlapping";
  // Negative strides are flipped; the merged view starts at their last element.
  EXPECT_EQ(MergeOf({5}, {-1}), (Merged{-4, {5}, {1}}));
  EXPECT_EQ(MergeOf({3, 4}, {-4, 1}), (Merged{-8, {12}, {1}}));
  EXPECT_EQ(MergeOf({3, 4}, {-8, -2}), (Merged{-22, {12}, {2}}));
  EXPECT_EQ(MergeOf({3, 4}, {-10, -2}), (Merged{-26, {3, 4}, {10, 2}}));

  MergedView view;
  const int64_t sizes[] = {3, 0, 2}, strides[] = {1, 1, 1};
  ASSERT_TRUE(MergeView(sizes, strides, 3, &view));
  EXPECT_TRUE(view.empty);
  // More dims of size 2 than any real view can have (2^65 elements).
  const std::vector<int64_t> many_sizes(65, 2);
  std::vector<int64_t> many_strides(65);
  for (int d = 0; d < 65; ++d) many_strides[d] = int64_t{3} << d % 60;
  EXPECT_FALSE(MergeView(many_sizes.data(), many_strides.data(), 65, &view));
}

// ---------------------------------------------------------------------------------------------
// ScanFiniteHost against the reference.

// Lengths around the vector widths (8 or 16 bytes a vector, 2 to 8 bytes an element) and beyond.
const std::vector<int64_t> kLengths = {1,   2,   3,   4,    5,    7,    8,    9,    15,
                                       16,  17,  31,  32,   33,   63,   64,   65,   100,
                                       127, 128, 129, 1000, 4095, 4096, 4097, 65537};

TEST(FiniteHostTest, AllFiniteGivesTheLargestMagnitude) {
  for (const Format& f : kFormats) {
    for (int64_t length : kLengths) {
      SCOPED_TRACE(std::string(f.name) + ", length " + std::to_string(length));
      const Elements elements = RandomFiniteElements(f, length, length);
      const FiniteScan scan = HostScan(elements, f);
      EXPECT_EQ(scan.flags, 0);
      if (length >= 4) {
        EXPECT_GT(scan.max_abs, 0.0);  // Random bits: 4 zeros in a row are unlikely.
      }
    }
  }
}

TEST(FiniteHostTest, SeesNanAndInfinitiesAtTheFirstLastAndAMiddleElement) {
  for (const Format& f : kFormats) {
    const struct {
      uint64_t bits;
      uint8_t flag;
    } planted[] = {{f.quiet_nan, kHasNan},
                   {f.sign | f.quiet_nan, kHasNan},
                   {f.inf + 1, kHasNan},
                   {f.inf, kHasPosInf},
                   {f.sign | f.inf, kHasNegInf}};
    for (int64_t length : kLengths) {
      const Elements finite = RandomFiniteElements(f, length, 100 + length);
      const int64_t one = 1;
      const double max_abs = ScanFiniteReference(finite.at(0), f.kind, &length, &one, 1).max_abs;
      for (const auto& p : planted) {
        for (int64_t at : {int64_t{0}, length / 2, length - 1}) {
          SCOPED_TRACE(std::string(f.name) + ", length " + std::to_string(length) + ", bits " +
                       std::to_string(p.bits) + " at " + std::to_string(at));
          Elements elements = finite;
          elements.Set(at, p.bits);
          const FiniteScan scan = HostScan(elements, f);
          EXPECT_EQ(scan.flags, p.flag);
          // The planted element replaced a finite one: the maximum can only have dropped.
          EXPECT_LE(scan.max_abs, max_abs);
        }
      }
      // All three kinds at once, at the three places.
      SCOPED_TRACE(std::string(f.name) + ", length " + std::to_string(length) + ", all three");
      Elements elements = finite;
      elements.Set(length - 1, f.sign | f.inf);
      elements.Set(length / 2, f.inf);
      elements.Set(0, f.quiet_nan);
      // Fewer than 3 elements: a later Set overwrote an earlier one.
      const uint8_t expected = length >= 3   ? kHasNan | kHasPosInf | kHasNegInf
                               : length == 2 ? kHasNan | kHasPosInf
                                             : kHasNan;
      EXPECT_EQ(HostScan(elements, f).flags, expected);
    }
  }
}

TEST(FiniteHostTest, RandomBitPatternsEqualTheReference) {
  std::mt19937_64 random(7);
  for (const Format& f : kFormats) {
    for (int64_t length : kLengths) {
      for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE(std::string(f.name) + ", length " + std::to_string(length));
        // Each element keeps its random bits, maybe non-finite, with probability 1 / 16^round;
        // else it is made finite: round 0 is raw bits, round 3 has few non-finite values or none.
        Elements elements(f, length);
        for (int64_t i = 0; i < length; ++i) {
          uint64_t bits = RandomBits(f, random);
          if ((random() & ((uint64_t{1} << (round * 4)) - 1)) != 0) {
            bits = (bits & ~f.sign) >= f.inf ? bits & ~(f.sign >> 1) : bits;
          }
          elements.Set(i, bits);
        }
        HostScan(elements, f);
      }
    }
  }
}

TEST(FiniteHostTest, FiniteExtremes) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (int64_t length : {int64_t{1}, int64_t{17}, int64_t{1000}}) {
      Elements elements = RandomFiniteElements(f, length, 3);
      // The largest finite value, negative, last (after every lane has seen smaller ones).
      elements.Set(length - 1, f.sign | f.max_finite);
      EXPECT_EQ(Describe(HostScan(elements, f)), Describe(Scan(0, f.max_finite_value)));

      // Subnormals only: the largest of them is all mantissa bits.
      const uint64_t largest_subnormal = (f.inf & ~(f.inf << 1)) - 1;
      Elements subnormals(f, length, 1);
      subnormals.Set(length / 2, f.sign | largest_subnormal);
      EXPECT_EQ(Describe(HostScan(subnormals, f)),
                Describe(Scan(0, static_cast<double>(largest_subnormal) * f.min_subnormal_value)));

      // Negative zeros: finite, magnitude +0.
      const FiniteScan zeros = HostScan(Elements(f, length, f.sign), f);
      EXPECT_EQ(Describe(zeros), Describe(Scan(0, 0)));
      EXPECT_FALSE(std::signbit(zeros.max_abs));

      // Non-finite values only: no finite maximum.
      Elements non_finite(f, length, f.quiet_nan);
      non_finite.Set(0, f.sign | f.inf);
      EXPECT_EQ(Describe(HostScan(non_finite, f)),
                Describe(Scan(length > 1 ? kHasNan | kHasNegInf : kHasNegInf, 0)));
    }
  }
}

TEST(FiniteHostTest, EmptyViewsReadNothing) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (const std::vector<int64_t>& sizes :
         {std::vector<int64_t>{0}, std::vector<int64_t>{3, 0}, std::vector<int64_t>{0, 5},
          std::vector<int64_t>{2, 0, 2}}) {
      const std::vector<int64_t> strides(sizes.size(), 1);
      // Null data: a read would crash.
      EXPECT_EQ(Describe(HostScan(nullptr, f, sizes, strides)), Describe(FiniteScan{}));
    }
  }
}

TEST(FiniteHostTest, ViewsThatAreNotContiguousSeeOnlyTheirElements) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    // A 16 x 24 buffer of NaN; the views below hold finite values and maybe one planted value.
    constexpr int64_t kRows = 16, kCols = 24;
    Elements buffer(f, kRows * kCols, f.quiet_nan);
    std::mt19937_64 random(11);
    auto fill = [&](int64_t offset, const std::vector<int64_t>& sizes,
                    const std::vector<int64_t>& strides) {
      // Every element of the view gets a finite value (odometer over the view's indices).
      std::vector<int64_t> index(sizes.size(), 0);
      while (true) {
        int64_t at = offset;
        for (size_t d = 0; d < sizes.size(); ++d) at += index[d] * strides[d];
        buffer.Set(at, RandomFinite(f, random));
        int d = static_cast<int>(sizes.size()) - 1;
        for (; d >= 0 && ++index[d] == sizes[d]; --d) index[d] = 0;
        if (d < 0) break;
      }
    };
    struct View {
      const char* what;
      int64_t offset;
      std::vector<int64_t> sizes;
      std::vector<int64_t> strides;
    };
    const View views[] = {
        {"a block of rows and columns", 2 * kCols + 3, {5, 17}, {kCols, 1}},
        {"transposed block", 2 * kCols + 3, {17, 5}, {1, kCols}},
        {"every other column", kCols + 1, {7, 9}, {kCols, 2}},
        {"every other element of a row", 5, {11}, {2}},
        {"a column", 4, {kRows}, {kCols}},
        {"a row broadcast to 6 rows", 3 * kCols, {6, kCols}, {0, 1}},
        {"an element broadcast", 7, {4, 9}, {0, 0}},
        {"rows flipped", 9 * kCols + 2, {6, 20}, {-kCols, 1}},
        {"both flipped, strided", 12 * kCols + 22, {5, 10}, {-2 * kCols, -2}},
        {"a permuted 3-d block", kCols + 1, {3, 4, 2}, {1, 2 * kCols, kCols}},
        {"overlapping rows (as_strided)", 3 * kCols, {8, 10}, {2, 1}},
        {"one element", 100, {1}, {1}},
        {"one element of a 3-d view", 101, {1, 1, 1}, {5, 3, 1}},
    };
    for (const View& v : views) {
      SCOPED_TRACE(v.what);
      fill(v.offset, v.sizes, v.strides);
      const FiniteScan clean = HostScan(buffer.at(v.offset), f, v.sizes, v.strides);
      EXPECT_EQ(clean.flags, 0) << "saw an element outside the view";
      // A planted +Inf at the view's last element (in index order) is seen.
      int64_t last = v.offset;
      for (size_t d = 0; d < v.sizes.size(); ++d) last += (v.sizes[d] - 1) * v.strides[d];
      const uint64_t saved = buffer.Get(last);
      buffer.Set(last, f.inf);
      EXPECT_EQ(HostScan(buffer.at(v.offset), f, v.sizes, v.strides).flags, kHasPosInf);
      buffer.Set(last, saved);
      // Back to NaN, for the next view.
      for (size_t i = 0; i < buffer.count(); ++i) buffer.Set(i, f.quiet_nan);
    }
    // A scalar (0 dims).
    Elements scalar(f, 1, f.sign | f.one);
    EXPECT_EQ(Describe(HostScan(scalar.at(0), f, {}, {})), Describe(Scan(0, 1.0)));
  }
}

// ---------------------------------------------------------------------------------------------
// The CUDA kernels' walks (finite_view.h) run on the CPU: what can be checked of them without a
// GPU.

TEST(CudaWalkTest, SplitIntoVectorsCoversEachElementOnce) {
  for (uint64_t element_bytes : {2, 4, 8}) {
    const uint64_t per_vector = 16 / element_bytes;
    for (uint64_t address = 4096; address < 4096 + 32; address += element_bytes) {
      for (uint64_t count = 0; count < 80; ++count) {
        SCOPED_TRACE(std::to_string(count) + " elements of " + std::to_string(element_bytes) +
                     " bytes at " + std::to_string(address));
        const VectorSplit split = SplitIntoVectors(address, count, element_bytes);
        ASSERT_LE(split.head + split.vectors * per_vector, count);
        EXPECT_LT(split.head, per_vector);
        // The rest is shorter than a vector, and vectors start on a 16-byte boundary.
        EXPECT_LT(count - split.head - split.vectors * per_vector, per_vector);
        if (split.vectors > 0) {
          EXPECT_EQ((address + split.head * element_bytes) % 16, 0u);
        }
      }
    }
  }
}

// The element offsets a view reaches, sorted, each once.
std::vector<int64_t> Reached(const std::vector<int64_t>& sizes,
                             const std::vector<int64_t>& strides) {
  std::vector<int64_t> offsets;
  std::vector<int64_t> index(sizes.size(), 0);
  while (true) {
    int64_t offset = 0;
    for (size_t d = 0; d < sizes.size(); ++d) offset += index[d] * strides[d];
    offsets.push_back(offset);
    int d = static_cast<int>(sizes.size()) - 1;
    for (; d >= 0 && ++index[d] == sizes[d]; --d) index[d] = 0;
    if (d < 0) break;
  }
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

// What the strided kernel reads of the merged view: ElementOffset of each index below the count.
template <typename Index>
std::vector<int64_t> KernelReads(const MergedView& view) {
  Index count = 1;
  for (int d = 0; d < view.dims; ++d) count *= static_cast<Index>(view.sizes[d]);
  std::vector<int64_t> offsets;
  for (Index i = 0; i < count; ++i) {
    offsets.push_back(view.offset + ElementOffset<8>(i, view.dims, view.sizes, view.strides));
  }
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

TEST(CudaWalkTest, MergedViewsReadWhatTheViewsReach) {
  struct View {
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
  };
  const View views[] = {
      {{}, {}},
      {{7}, {1}},
      {{7}, {-3}},
      {{4, 5}, {1, 4}},
      {{4, 5}, {12, 2}},
      {{4, 5}, {-12, 1}},
      {{6, 5}, {0, 1}},
      {{3, 4, 5}, {5, 15, 1}},
      {{3, 4, 5}, {-20, 0, -2}},
      {{8, 10}, {2, 1}},
      {{2, 2, 2, 2, 2, 2, 2, 3}, {6400, 3201, 1600, 803, 400, 205, 100, 7}},
  };
  for (const View& v : views) {
    SCOPED_TRACE(::testing::PrintToString(v.sizes) + " " + ::testing::PrintToString(v.strides));
    MergedView merged;
    ASSERT_TRUE(
        MergeView(v.sizes.data(), v.strides.data(), static_cast<int>(v.sizes.size()), &merged));
    ASSERT_LE(merged.dims, 8);
    EXPECT_EQ(KernelReads<uint32_t>(merged), Reached(v.sizes, v.strides));
    EXPECT_EQ(KernelReads<uint64_t>(merged), Reached(v.sizes, v.strides));
  }
}

// ---------------------------------------------------------------------------------------------
// The CUDA scan.

TEST(CudaFiniteTest, FailsWithAReasonWithoutADevice) {
  if (CudaFiniteAvailable()) GTEST_SKIP() << "a CUDA device is present";
  std::string error;
  EXPECT_EQ(AllocFiniteSlotsCuda(0, 1, &error), nullptr);
  EXPECT_NE(error, "");
  error.clear();
  const float value = 1;
  const int64_t size = 1, stride = 1;
  FiniteSlot slot{};
  EXPECT_FALSE(ScanFiniteCudaAsync(&value, FloatKind::kFloat32, &size, &stride, 1, 0, nullptr,
                                   &slot, &error));
  EXPECT_NE(error, "");
  error.clear();
  FiniteScan scan;
  EXPECT_FALSE(ReadFiniteSlotsCuda(&slot, 1, 0, nullptr, &scan, &error));
  EXPECT_NE(error, "");
  FreeFiniteSlotsCuda(nullptr);
}

#ifdef TORCHRR_KERNELS_CUDA

class CudaFiniteDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaFiniteAvailable()) {
      GTEST_SKIP() << "no CUDA device (or no usable driver): ScanFiniteCudaAsync is not checked";
    }
    ASSERT_EQ(cudaGetDevice(&device_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    std::string error;
    slots_ = AllocFiniteSlotsCuda(device_, kSlots, &error);
    ASSERT_NE(slots_, nullptr) << error;
  }
  void TearDown() override {
    FreeFiniteSlotsCuda(slots_);
    cudaFree(device_data_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Copies `elements` to the device (replacing what an earlier call copied).
  void Upload(const Elements& elements) {
    cudaFree(device_data_);
    device_data_ = nullptr;
    ASSERT_EQ(cudaMalloc(&device_data_, elements.bytes().size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device_data_, elements.bytes().data(), elements.bytes().size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  // Queues the scan of the view at element `offset` of the uploaded data into slot `slot`.
  void Queue(const Format& f, int64_t offset, const std::vector<int64_t>& sizes,
             const std::vector<int64_t>& strides, size_t slot, cudaStream_t stream) {
    std::string error;
    EXPECT_TRUE(ScanFiniteCudaAsync(
        static_cast<unsigned char*>(device_data_) + offset * f.bytes, f.kind, sizes.data(),
        strides.data(), static_cast<int>(sizes.size()), device_, stream, slots_ + slot, &error))
        << error;
  }

  std::vector<FiniteScan> Read(size_t count) {
    std::vector<FiniteScan> scans(count);
    std::string error;
    EXPECT_TRUE(ReadFiniteSlotsCuda(slots_, count, device_, stream_, scans.data(), &error))
        << error;
    return scans;
  }

  static constexpr size_t kSlots = 128;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  FiniteSlot* slots_ = nullptr;
  void* device_data_ = nullptr;
};

TEST_F(CudaFiniteDeviceTest, ContiguousScansEqualTheReference) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    // Lengths around the 16-byte loads and the block size, at offsets that move the first
    // 16-byte boundary, with NaN, +Inf and -Inf planted in some of them.
    std::vector<int64_t> lengths = kLengths;
    lengths.push_back(3 << 20);
    const int64_t total = 3 << 20 | 64;
    Elements elements = RandomFiniteElements(f, total, 21);
    // Each seen by some of the views below and not by others.
    elements.Set(2, f.inf);
    elements.Set(4100, f.sign | f.quiet_nan);
    elements.Set(3 << 20, f.sign | f.inf);
    Upload(elements);
    struct Scanned {
      int64_t offset;
      int64_t length;
    };
    std::vector<Scanned> scanned;
    for (int64_t length : lengths) {
      for (int64_t offset : {0, 1, 3, 5}) {
        if (scanned.size() == kSlots) break;
        Queue(f, offset, {length}, {1}, scanned.size(), stream_);
        scanned.push_back({offset, length});
      }
    }
    const std::vector<FiniteScan> scans = Read(scanned.size());
    for (size_t i = 0; i < scanned.size(); ++i) {
      const int64_t length = scanned[i].length, one = 1;
      EXPECT_EQ(Describe(scans[i]), Describe(ScanFiniteReference(elements.at(scanned[i].offset),
                                                                 f.kind, &length, &one, 1)))
          << "length " << length << " at +" << scanned[i].offset;
    }
    // Fresh slots for the next format.
    FreeFiniteSlotsCuda(slots_);
    std::string error;
    slots_ = AllocFiniteSlotsCuda(device_, kSlots, &error);
    ASSERT_NE(slots_, nullptr) << error;
  }
}

TEST_F(CudaFiniteDeviceTest, StridedViewsEqualTheReference) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    constexpr int64_t kRows = 300, kCols = 500;
    Elements elements = RandomFiniteElements(f, kRows * kCols, 22);
    // NaN outside the views' elements only where noted; +Inf in row 7, column 9.
    elements.Set(7 * kCols + 9, f.inf);
    elements.Set(kRows * kCols - 1, f.quiet_nan);
    Upload(elements);
    struct View {
      const char* what;
      int64_t offset;
      std::vector<int64_t> sizes;
      std::vector<int64_t> strides;
    };
    const std::vector<View> views = {
        {"rows 1-298, columns 2-401", kCols + 2, {298, 400}, {kCols, 1}},
        {"transposed", 0, {kCols, kRows - 1}, {1, kCols}},
        {"every other column", 1, {kRows - 1, 249}, {kCols, 2}},
        {"a column", 9, {kRows}, {kCols}},
        {"broadcast row", 7 * kCols, {64, kCols}, {0, 1}},
        {"flipped", (kRows - 2) * kCols, {kRows - 1, kCols}, {-kCols, 1}},
        {"3-d", 3, {10, 20, 30}, {11 * kCols, 3 * kCols, 7}},
        {"8 dims",
         0,
         {2, 2, 2, 2, 2, 2, 2, 3},
         {64 * kCols, 32 * kCols + 1, 16 * kCols, 8 * kCols + 3, 4 * kCols, 2 * kCols + 5, kCols,
          7}},
        {"scalar", 12, {}, {}},
    };
    for (size_t i = 0; i < views.size(); ++i) {
      Queue(f, views[i].offset, views[i].sizes, views[i].strides, i, stream_);
    }
    const std::vector<FiniteScan> scans = Read(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      const View& v = views[i];
      EXPECT_EQ(Describe(scans[i]),
                Describe(ScanFiniteReference(elements.at(v.offset), f.kind, v.sizes.data(),
                                             v.strides.data(), static_cast<int>(v.sizes.size()))))
          << v.what;
    }
    FreeFiniteSlotsCuda(slots_);
    std::string error;
    slots_ = AllocFiniteSlotsCuda(device_, kSlots, &error);
    ASSERT_NE(slots_, nullptr) << error;
  }
}

TEST_F(CudaFiniteDeviceTest, ScansAccumulateInOneSlot) {
  const Format& f = kFormats[2];  // float32
  Elements elements = RandomFiniteElements(f, 20000, 23);
  elements.Set(10, f.inf);
  elements.Set(15000, f.sign | f.inf);
  elements.Set(16000, f.max_finite);
  Upload(elements);
  // Slot 0: the first half then the second; on two streams, the second the legacy default one.
  Queue(f, 0, {10000}, {1}, 0, stream_);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  Queue(f, 10000, {10000}, {1}, 0, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  // Slot 1: an empty view changes nothing.
  Queue(f, 0, {0}, {1}, 1, stream_);
  const std::vector<FiniteScan> scans = Read(2);
  EXPECT_EQ(Describe(scans[0]), Describe(Scan(kHasPosInf | kHasNegInf, FLT_MAX)));
  EXPECT_EQ(Describe(scans[1]), Describe(FiniteScan{}));
  // Reading leaves the slots as they are.
  EXPECT_EQ(Describe(Read(1)[0]), Describe(scans[0]));
}

TEST_F(CudaFiniteDeviceTest, ReportsBadArgumentsAndLeavesTheCurrentDevice) {
  const Format& f = kFormats[0];
  Upload(Elements(f, 64, f.one));
  std::string error;
  const std::vector<int64_t> nine_sizes(9, 2);
  std::vector<int64_t> nine_strides(9);
  for (int d = 0; d < 9; ++d) nine_strides[d] = (int64_t{4} << d) - 1;  // None merge.
  EXPECT_FALSE(ScanFiniteCudaAsync(device_data_, f.kind, nine_sizes.data(), nine_strides.data(), 9,
                                   device_, stream_, slots_, &error));
  EXPECT_NE(error, "");
  error.clear();
  const int64_t size = 4, stride = 1;
  EXPECT_FALSE(ScanFiniteCudaAsync(static_cast<unsigned char*>(device_data_) + 1, f.kind, &size,
                                   &stride, 1, device_, stream_, slots_, &error))
      << "misaligned";
  EXPECT_NE(error, "");
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  EXPECT_EQ(AllocFiniteSlotsCuda(devices, 1, &error), nullptr);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, device_);
  // The failures above left no error behind for the next call.
  Queue(f, 0, {64}, {1}, 0, stream_);
  EXPECT_EQ(Describe(Read(1)[0]), Describe(Scan(0, 1.0)));
}

#else

TEST(CudaFiniteDeviceTest, ContiguousScansEqualTheReference) {
  GTEST_SKIP() << "this build has no CUDA (no nvcc found, or TORCHRR_WITH_CUDA=OFF)";
}

#endif  // TORCHRR_KERNELS_CUDA

}  // namespace
}  // namespace torchrr::kernels
