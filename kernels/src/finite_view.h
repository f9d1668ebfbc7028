// What the finiteness scans (finite.h) share between the CPU and the CUDA code, as plain C++ that
// both compile and the tests run on the CPU:
//   FloatFormat<kind>  each FloatKind's bit patterns: a value is non-finite iff its magnitude bits
//                      (the sign cleared) are >= kInf, a NaN iff they are > kInf, and finite
//                      magnitudes order as those bits do, as integers;
//   HalfToDouble...    exact conversions of binary16 and bfloat16 bits to double;
//   MergeView()        a strided view reduced to the fewest dims that reach the same elements;
//   SplitIntoVectors(), ElementOffset()
//                      how the CUDA kernels walk a merged view, contiguous or not.
#ifndef TORCHRR_KERNELS_FINITE_VIEW_H_
#define TORCHRR_KERNELS_FINITE_VIEW_H_

#include <cstdint>
#include <cstring>

#include "torchrr/kernels/finite.h"

#ifndef TORCHRR_HOST_DEVICE
#if defined(__CUDACC__)
#define TORCHRR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TORCHRR_HOST_DEVICE inline
#endif
#endif
#ifndef TORCHRR_UNROLL
#if defined(__CUDA_ARCH__)
#define TORCHRR_UNROLL _Pragma("unroll")
#else
#define TORCHRR_UNROLL
#endif
#endif

namespace torchrr::kernels {

// The double whose bits are `bits`.
TORCHRR_HOST_DEVICE double BitsToDouble(uint64_t bits) {
  double value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// binary16 to double, exactly: NaN payloads and signs kept, subnormals (exponent field 0) as
// mantissa * 2^-24.
TORCHRR_HOST_DEVICE double HalfToDouble(uint16_t half) {
  const uint64_t sign = static_cast<uint64_t>(half >> 15) << 63;
  const uint64_t exponent = (half >> 10) & 0x1f;
  const uint64_t mantissa = half & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: exact in double arithmetic (10 significant bits).
    const double magnitude = static_cast<double>(mantissa) * 0x1p-24;
    return sign != 0 ? -magnitude : magnitude;
  }
  // binary16's exponent bias is 15, binary64's 1023; all ones (Inf, NaN) stays all ones.
  const uint64_t biased = exponent == 0x1f ? 0x7ff : exponent - 15 + 1023;
  return BitsToDouble(sign | biased << 52 | mantissa << 42);
}

// bfloat16 is the upper half of a binary32.
TORCHRR_HOST_DEVICE double BFloat16ToDouble(uint16_t bfloat) {
  const uint32_t bits = static_cast<uint32_t>(bfloat) << 16;
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// The bit patterns of each FloatKind. `Word` is the element's width as a signed integer: magnitude
// bits (sign cleared) are non-negative in it, and x86's SSE2 has signed compares only, so signed
// words let the host loop vectorize without SSE4.
template <FloatKind kKind>
struct FloatFormat;

template <>
struct FloatFormat<FloatKind::kFloat16> {
  using Word = int16_t;
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static constexpr Bits kInf = 0x7c00;
  TORCHRR_HOST_DEVICE static double MagnitudeToDouble(Bits magnitude) {
    return HalfToDouble(magnitude);
  }
};

template <>
struct FloatFormat<FloatKind::kBFloat16> {
  using Word = int16_t;
  using Bits = uint16_t;
  static constexpr Bits kSign = 0x8000;
  static constexpr Bits kInf = 0x7f80;
  TORCHRR_HOST_DEVICE static double MagnitudeToDouble(Bits magnitude) {
    return BFloat16ToDouble(magnitude);
  }
};

template <>
struct FloatFormat<FloatKind::kFloat32> {
  using Word = int32_t;
  using Bits = uint32_t;
  static constexpr Bits kSign = 0x80000000u;
  static constexpr Bits kInf = 0x7f800000u;
  TORCHRR_HOST_DEVICE static double MagnitudeToDouble(Bits magnitude) {
    float value;
    memcpy(&value, &magnitude, sizeof(value));
    return value;
  }
};

template <>
struct FloatFormat<FloatKind::kFloat64> {
  using Word = int64_t;
  using Bits = uint64_t;
  static constexpr Bits kSign = 0x8000000000000000ull;
  static constexpr Bits kInf = 0x7ff0000000000000ull;
  TORCHRR_HOST_DEVICE static double MagnitudeToDouble(Bits magnitude) {
    return BitsToDouble(magnitude);
  }
};

// Bytes per element of `kind`.
TORCHRR_HOST_DEVICE int ElementBytes(FloatKind kind) {
  return kind == FloatKind::kFloat64 ? 8 : kind == FloatKind::kFloat32 ? 4 : 2;
}

// A view with more dims of size > 1 has at least 2^65 elements; PyTorch's have fewer than 2^63.
inline constexpr int kMaxViewDims = 64;

// A strided view reduced to the fewest dims that reach the same set of elements (a scan's result
// depends on nothing else), by MergeView():
//   - a dim of size 1 adds nothing, nor does a broadcast dim (stride 0): both are dropped;
//   - a negative stride is flipped, the offset moved to the dim's last element;
//   - dims are sorted by stride, largest first, so that a transposed or permuted contiguous view
//     is contiguous again;
//   - a dim of stride T * S over a dim (S, T) is merged with it into one of size and stride
//     (S_outer * S, T): adjacent rows of a contiguous block.
// A contiguous view of any shape becomes one dim of stride 1.
struct MergedView {
  bool empty = false;           // Some size was 0 (or negative): no element at all.
  int64_t offset = 0;           // Elements from element 0 to the first element of the merged view.
  int dims = 0;                 // 0 (and !empty): one element, at `offset`.
  int64_t sizes[kMaxViewDims];  // > 1.
  int64_t strides[kMaxViewDims];  // > 0, decreasing; the innermost dim is the last.
};

// Fills *merged from the view of `dims` dims. Returns false when more than kMaxViewDims dims remain
// to be merged (a view of at least 2^64 elements, which PyTorch cannot make). A stride of INT64_MIN
// on a dim of size > 1 reaches no memory a tensor can have; it is taken as INT64_MAX.
inline bool MergeView(const int64_t* sizes, const int64_t* strides, int dims, MergedView* merged) {
  merged->empty = false;
  merged->offset = 0;
  merged->dims = 0;
  for (int d = 0; d < dims; ++d) {
    if (sizes[d] <= 0) {
      merged->empty = true;
      merged->dims = 0;
      return true;
    }
  }
  int kept = 0;
  for (int d = 0; d < dims; ++d) {
    if (sizes[d] == 1 || strides[d] == 0) continue;
    if (kept == kMaxViewDims) return false;
    int64_t stride = strides[d];
    if (stride < 0) {
      merged->offset += (sizes[d] - 1) * stride;
      stride = stride == INT64_MIN ? INT64_MAX : -stride;
    }
    // Insertion sort, largest stride first: at most 64 dims, almost always fewer than 5.
    int at = kept++;
    for (; at > 0 && merged->strides[at - 1] < stride; --at) {
      merged->sizes[at] = merged->sizes[at - 1];
      merged->strides[at] = merged->strides[at - 1];
    }
    merged->sizes[at] = sizes[d];
    merged->strides[at] = stride;
  }
  // Merge each dim into the one outside it where the outer steps over exactly one inner run.
  int out = 0;
  for (int d = 0; d < kept; ++d) {
    if (out > 0 && merged->strides[out - 1] == merged->strides[d] * merged->sizes[d]) {
      merged->sizes[out - 1] *= merged->sizes[d];
      merged->strides[out - 1] = merged->strides[d];
    } else {
      merged->sizes[out] = merged->sizes[d];
      merged->strides[out] = merged->strides[d];
      ++out;
    }
  }
  merged->dims = out;
  return true;
}

// How the contiguous CUDA kernel reads `count` elements of `element_bytes` bytes (2, 4 or 8) at
// `address` (a multiple of element_bytes): `head` elements one by one up to the first 16-byte
// boundary, then `vectors` 16-byte loads, then the rest one by one.
struct VectorSplit {
  uint64_t head;
  uint64_t vectors;
};

TORCHRR_HOST_DEVICE VectorSplit SplitIntoVectors(uint64_t address, uint64_t count,
                                                 uint64_t element_bytes) {
  const uint64_t per_vector = 16 / element_bytes;
  const uint64_t past_boundary = address % 16 / element_bytes;
  uint64_t head = past_boundary == 0 ? 0 : per_vector - past_boundary;
  if (head > count) head = count;
  return {head, (count - head) / per_vector};
}

// The offset in elements, from the merged view's first element, of its element `index` in
// row-major order (the innermost dim fastest, as consecutive threads read it). The first
// `kMaxDims` of `sizes` and `strides` are read when dims says so; `Index` is the type the
// divisions run in, wide enough for every index.
template <int kMaxDims, typename Index>
TORCHRR_HOST_DEVICE int64_t ElementOffset(Index index, int dims, const int64_t* sizes,
                                          const int64_t* strides) {
  int64_t offset = 0;
  TORCHRR_UNROLL
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < dims) {
      const Index size = static_cast<Index>(sizes[d]);
      offset += static_cast<int64_t>(index % size) * strides[d];
      index /= size;
    }
  }
  return offset;
}

}  // namespace torchrr::kernels

#endif  // TORCHRR_KERNELS_FINITE_VIEW_H_
