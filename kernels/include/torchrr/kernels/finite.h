// Finiteness scans: whether a floating tensor holds a NaN, a +Inf or a -Inf, and its largest
// finite magnitude, so that the recorder can name the first op whose output went non-finite (and
// the one that came close: a finite maximum near the type's largest value).
//
// A scan reads a strided view as PyTorch describes it: element (i0, ..., i{d-1}) is at
// data + sum(ik * strides[k]) elements. Its result depends only on the set of elements the view
// reaches, not on their order or how often each is reached, so a scan may visit them in any order
// (broadcast dims once, negative strides flipped, dims sorted and merged).
//
// The host scan runs on the calling thread. The CUDA scan is a second implementation of the same
// function that accumulates into a device slot with no host synchronization, so that the recorder
// can queue one scan per op and read the slots once, later; the tests compare both against
// ScanFiniteReference(). This header has no CUDA types.
#ifndef TORCHRR_KERNELS_FINITE_H_
#define TORCHRR_KERNELS_FINITE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchrr::kernels {

// The floating element types the scan reads: IEEE binary16, bfloat16 (binary32's upper half),
// binary32 and binary64, in the host's (little-endian) byte order.
enum class FloatKind : uint8_t { kFloat16, kBFloat16, kFloat32, kFloat64 };

// Bits of FiniteScan::flags. A NaN of either sign (quiet or signaling) sets kHasNan.
inline constexpr uint8_t kHasNan = 1, kHasPosInf = 2, kHasNegInf = 4;

struct FiniteScan {
  uint8_t flags = 0;   // kHasNan | kHasPosInf | kHasNegInf
  double max_abs = 0;  // largest |x| over the finite elements, exactly; 0 when none
};

// Scans the strided view of `dims` dims (sizes and strides in elements, as PyTorch gives them;
// strides may be 0, negative or overlapping) whose element 0 is at `data` (host memory, any
// alignment). dims == 0 is a scalar: the one element at `data`. A view with any size 0 gives {}
// and reads nothing. Every element the view reaches must be readable, and its element count must
// fit in int64_t (true of every PyTorch tensor). Thread-safe; no allocation.
FiniteScan ScanFiniteHost(const void* data, FloatKind kind, const int64_t* sizes,
                          const int64_t* strides, int dims);

// The same function as ScanFiniteHost, written as plainly as possible: every element in index
// order, decoded to a double, std::isnan / std::isinf. The reference the tests compare
// ScanFiniteHost and the CUDA scan against; slow (a division per dim per element), and a broadcast
// view costs its full element count. Thread-safe; no allocation.
FiniteScan ScanFiniteReference(const void* data, FloatKind kind, const int64_t* sizes,
                               const int64_t* strides, int dims);

// ---------------------------------------------------------------------------------------------
// CUDA: scans run on a stream with no host synchronization; results accumulate in device slots
// that the caller reads later, in bulk.

// One scan result in device memory. Scans OR into `flags` and max into `max_abs_bits`, the bits
// of a non-negative double (which order as unsigned integers), so that many scans can accumulate
// into one slot, each block of a scan with one atomicOr and one atomicMax. All zero is the empty
// result {}.
struct FiniteSlot {
  uint32_t flags;
  uint32_t reserved;
  uint64_t max_abs_bits;
};

// True when this build has the CUDA implementation and a CUDA device is present. Never throws;
// the first call may initialize the CUDA runtime.
bool CudaFiniteAvailable();

// Allocates `count` zeroed slots on device `device`, waiting for the zeroing. Returns nullptr and
// sets *error when the build has no CUDA, the device is absent, count is 0 or a CUDA call fails.
// Thread-safe; leaves the calling thread's current device as it was.
FiniteSlot* AllocFiniteSlotsCuda(int device, size_t count, std::string* error);

// Frees slots from AllocFiniteSlotsCuda, after the device is done with them (cudaFree waits for
// the device). nullptr, or a pointer that AllocFiniteSlotsCuda did not return or that was freed
// already: nothing. Errors are dropped. Thread-safe.
void FreeFiniteSlotsCuda(FiniteSlot* slots);

// Queues on `stream` (a cudaStream_t; nullptr for the legacy default stream) a scan of the view
// (as ScanFiniteHost's, at `device_data` in memory of device `device`) whose result is OR-ed and
// max-ed into *device_slot, after the work already queued there. Does not wait. An empty view
// queues nothing. On a stream that is capturing a CUDA graph the scan is captured, and then runs
// (and accumulates) at each replay. Returns false and sets *error when the build has no CUDA, the
// device is absent, the view keeps more than 8 dims once its size-1 and broadcast dims are dropped
// and its contiguous ones merged (no tensor made by slicing, permuting or expanding fewer than 9
// dims does), its data is not aligned to its element size, or the launch fails; never throws.
// Thread-safe; leaves the calling thread's current device as it was.
bool ScanFiniteCudaAsync(const void* device_data, FloatKind kind, const int64_t* sizes,
                         const int64_t* strides, int dims, int device, void* stream,
                         FiniteSlot* device_slot, std::string* error);

// Waits for `stream` (everything queued there, the scans included), then copies `count` slots from
// `device_slots` to the host and converts slot i into out[i]. The slots are left as they are.
// Returns false and sets *error when the build has no CUDA, the stream is capturing a CUDA graph
// (waiting would invalidate the capture), or a CUDA call fails; never throws. Thread-safe.
bool ReadFiniteSlotsCuda(const FiniteSlot* device_slots, size_t count, int device, void* stream,
                         FiniteScan* out, std::string* error);

}  // namespace torchrr::kernels

#endif  // TORCHRR_KERNELS_FINITE_H_
