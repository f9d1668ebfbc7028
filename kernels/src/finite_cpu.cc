// finite.h's host scans: ScanFiniteHost (the fast path) and ScanFiniteReference (the plain one).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "finite_view.h"
#include "torchrr/kernels/finite.h"

namespace torchrr::kernels {
namespace {

// A partial scan in the element's own width, as integers only, so that the contiguous loop is
// branch-free and vectorizes: each flag is a mask (0 or all ones) OR-ed over the elements, and the
// maximum is that of the finite elements' magnitude bits, which order as their values do.
template <FloatKind kKind>
struct Partial {
  using Format = FloatFormat<kKind>;
  using Word = typename Format::Word;
  static constexpr Word kMagnitude = static_cast<Word>(~Format::kSign);
  static constexpr Word kInf = static_cast<Word>(Format::kInf);
  static constexpr Word kNegInf = static_cast<Word>(Format::kSign | Format::kInf);

  Word nan = 0;
  Word pos_inf = 0;
  Word neg_inf = 0;
  Word max_abs = 0;

  void Add(Word bits) {
    const Word magnitude = bits & kMagnitude;
    nan |= -static_cast<Word>(magnitude > kInf);
    pos_inf |= -static_cast<Word>(bits == kInf);
    neg_inf |= -static_cast<Word>(bits == kNegInf);
    // Non-finite magnitudes count as 0, which never raises the maximum.
    const Word finite = magnitude < kInf ? magnitude : Word{0};
    max_abs = max_abs > finite ? max_abs : finite;
  }

  void Merge(const Partial& other) {
    nan |= other.nan;
    pos_inf |= other.pos_inf;
    neg_inf |= other.neg_inf;
    max_abs = std::max(max_abs, other.max_abs);
  }

  FiniteScan Finish() const {
    FiniteScan scan;
    scan.flags = (nan != 0 ? kHasNan : 0) | (pos_inf != 0 ? kHasPosInf : 0) |
                 (neg_inf != 0 ? kHasNegInf : 0);
    scan.max_abs = Format::MagnitudeToDouble(static_cast<typename Format::Bits>(max_abs));
    return scan;
  }
};

template <FloatKind kKind>
typename Partial<kKind>::Word LoadWord(const unsigned char* p) {
  typename Partial<kKind>::Word word;
  std::memcpy(&word, p, sizeof(word));
  return word;
}

// GCC's -O2 vectorizes only loops whose trip count is a known multiple of the vector width (its
// "very cheap" cost model); ScanContiguous's is not, and without vectors it runs at about a fifth
// of the speed. This gives that one function -O3's cost model. Clang vectorizes it at -O2 as it is
// (and has no such attribute). SSE2, x86-64's baseline, has no 64-bit compare: float64 stays
// scalar.
#if defined(__GNUC__) && !defined(__clang__)
#define TORCHRR_VECTORIZE __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define TORCHRR_VECTORIZE
#endif

// Adds the `n` contiguous elements at `p` to *partial: one branch-free pass that the compiler
// vectorizes, the partial's fields becoming vectors of lanes merged after the loop.
template <FloatKind kKind>
[[gnu::always_inline]] inline void ScanContiguousLoop(const unsigned char* p, int64_t n,
                                                      Partial<kKind>* partial) {
  using Word = typename Partial<kKind>::Word;
  // A local, so that the compiler knows no store in the loop changes it.
  Partial<kKind> local;
  for (int64_t i = 0; i < n; ++i) local.Add(LoadWord<kKind>(p + i * sizeof(Word)));
  partial->Merge(local);
}

template <FloatKind kKind>
TORCHRR_VECTORIZE void ScanContiguousBaseline(const unsigned char* p, int64_t n,
                                              Partial<kKind>* partial) {
  ScanContiguousLoop(p, n, partial);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same loop in 32-byte vectors (and 64-bit compares for float64), for CPUs with AVX2: the
// recorder scans each output right after the op wrote it, mostly from cache, where the baseline's
// 16-byte vectors leave half of the load bandwidth unused.
template <FloatKind kKind>
TORCHRR_VECTORIZE __attribute__((target("avx2"))) void ScanContiguousAvx2(
    const unsigned char* p, int64_t n, Partial<kKind>* partial) {
  ScanContiguousLoop(p, n, partial);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

template <FloatKind kKind>
void ScanContiguous(const unsigned char* p, int64_t n, Partial<kKind>* partial) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasAvx2()) return ScanContiguousAvx2(p, n, partial);
#endif
  ScanContiguousBaseline(p, n, partial);
}

// Adds the `n` elements `stride` elements apart from `p` to *partial.
template <FloatKind kKind>
void ScanStrided(const unsigned char* p, int64_t n, int64_t stride, Partial<kKind>* partial) {
  using Word = typename Partial<kKind>::Word;
  for (int64_t i = 0; i < n; ++i) partial->Add(LoadWord<kKind>(p + i * stride * sizeof(Word)));
}

// The fast path over a merged view: the innermost dim as runs, the outer ones as an odometer.
template <FloatKind kKind>
FiniteScan ScanMerged(const unsigned char* data, const MergedView& view) {
  constexpr int64_t kBytes = sizeof(typename Partial<kKind>::Word);
  Partial<kKind> partial;
  if (view.dims == 0) {
    partial.Add(LoadWord<kKind>(data + view.offset * kBytes));
    return partial.Finish();
  }
  const int inner = view.dims - 1;
  int64_t index[kMaxViewDims] = {};  // Of the outer dims.
  int64_t offset = view.offset;      // Of the current run's first element.
  while (true) {
    const unsigned char* run = data + offset * kBytes;
    if (view.strides[inner] == 1) {
      ScanContiguous(run, view.sizes[inner], &partial);
    } else {
      ScanStrided(run, view.sizes[inner], view.strides[inner], &partial);
    }
    // The next run: the innermost outer dim with an index left steps, the dims inside it restart.
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++index[d] < view.sizes[d]) {
        offset += view.strides[d];
        break;
      }
      index[d] = 0;
      offset -= (view.sizes[d] - 1) * view.strides[d];
    }
    if (d < 0) return partial.Finish();
  }
}

// The `kind` element at `p`, as a double, exactly.
double DecodeElement(const unsigned char* p, FloatKind kind) {
  switch (kind) {
    case FloatKind::kFloat16: {
      uint16_t half;
      std::memcpy(&half, p, sizeof(half));
      return HalfToDouble(half);
    }
    case FloatKind::kBFloat16: {
      uint16_t bfloat;
      std::memcpy(&bfloat, p, sizeof(bfloat));
      return BFloat16ToDouble(bfloat);
    }
    case FloatKind::kFloat32: {
      float value;
      std::memcpy(&value, p, sizeof(value));
      return value;
    }
    case FloatKind::kFloat64: {
      double value;
      std::memcpy(&value, p, sizeof(value));
      return value;
    }
  }
  return 0;
}

}  // namespace

FiniteScan ScanFiniteHost(const void* data, FloatKind kind, const int64_t* sizes,
                          const int64_t* strides, int dims) {
  MergedView view;
  if (!MergeView(sizes, strides, dims, &view)) {
    return ScanFiniteReference(data, kind, sizes, strides, dims);
  }
  if (view.empty) return {};
  const auto* p = static_cast<const unsigned char*>(data);
  switch (kind) {
    case FloatKind::kFloat16:
      return ScanMerged<FloatKind::kFloat16>(p, view);
    case FloatKind::kBFloat16:
      return ScanMerged<FloatKind::kBFloat16>(p, view);
    case FloatKind::kFloat32:
      return ScanMerged<FloatKind::kFloat32>(p, view);
    case FloatKind::kFloat64:
      return ScanMerged<FloatKind::kFloat64>(p, view);
  }
  return {};
}

FiniteScan ScanFiniteReference(const void* data, FloatKind kind, const int64_t* sizes,
                               const int64_t* strides, int dims) {
  int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    if (sizes[d] <= 0) return {};
    count *= sizes[d];
  }
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t element_bytes = ElementBytes(kind);
  FiniteScan scan;
  for (int64_t i = 0; i < count; ++i) {
    // Element i in row-major order: its index in each dim, innermost first.
    int64_t offset = 0;
    int64_t rest = i;
    for (int d = dims - 1; d >= 0; --d) {
      offset += rest % sizes[d] * strides[d];
      rest /= sizes[d];
    }
    const double value = DecodeElement(p + offset * element_bytes, kind);
    if (std::isnan(value)) {
      scan.flags |= kHasNan;
    } else if (std::isinf(value)) {
      scan.flags |= value > 0 ? kHasPosInf : kHasNegInf;
    } else {
      scan.max_abs = std::max(scan.max_abs, std::fabs(value));
    }
  }
  return scan;
}

}  // namespace torchrr::kernels
