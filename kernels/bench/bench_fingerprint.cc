// bench_fingerprint: the speed of fingerprint v1 (fingerprint.h) and of finiteness scans
// (finite.h).
//   CPU   FingerprintHost on 64 and 256 MiB; ScanFiniteHost on the same, read as float32 and as
//         bfloat16.
//   CUDA  (built with it, and a device present) FingerprintCuda on 64 MiB, 256 MiB and 1 GiB; on
//         4 KiB and 1 MiB, whose time is mostly the fixed cost of a call; and on 64 MiB at an
//         unaligned address (the byte-load path). Each next to a device-to-device copy of the same
//         size, whose bandwidth counts the bytes read and written. Fingerprint times are whole
//         calls (launches, stream synchronize, result): what the recorder pays. Then
//         ScanFiniteCudaAsync on 64 MiB, 256 MiB and 1 GiB as float32 and bfloat16, timed from
//         the queueing to ReadFiniteSlotsCuda's return (one scan, one read).
//
// Prints one table and exits 0; a CUDA step that fails prints why and the table goes on without it.
//   bench_fingerprint [runs]   (runs per measurement, default 10; the median is shown)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#ifdef TORCHRR_KERNELS_CUDA
#include <cuda_runtime.h>
#endif

#include "torchrr/kernels/fingerprint.h"
#include "torchrr/kernels/finite.h"

namespace {

using torchrr::kernels::FingerprintHost;
using torchrr::kernels::FloatKind;

// The finiteness scans' element types benchmarked: training's usual two.
struct ScannedKind {
  FloatKind kind;
  const char* name;
  uint64_t bytes;
};
constexpr ScannedKind kScannedKinds[] = {{FloatKind::kFloat32, "f32", 4},
                                         {FloatKind::kBFloat16, "bf16", 2}};

constexpr uint64_t kMiB = 1ull << 20;
// An H200's HBM3e bandwidth (datasheet), the yardstick of the CUDA implementation.
constexpr double kH200BytesPerSecond = 4.8e12;

// Seconds of one call of `run`: the median of `runs` after one warm-up call.
double MedianSeconds(int runs, const std::function<double()>& run) {
  run();
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) times.push_back(run());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double HostSeconds(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string SizeName(uint64_t bytes) {
  if (bytes % (1024 * kMiB) == 0) return std::to_string(bytes / (1024 * kMiB)) + " GiB";
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes / 1024) + " KiB";
}

void PrintHeader() {
  std::printf("%-7s %-18s %11s %10s %10s %10s\n", "where", "range", "time (us)", "GB/s", "of copy",
              "of 4.8TB/s");
}

// One row; `copy_gbps` <= 0 leaves the fractions blank.
void PrintRow(const char* where, const std::string& range, double seconds, uint64_t bytes,
              double copy_gbps) {
  const double gbps = bytes / seconds / 1e9;
  std::printf("%-7s %-18s %11.1f %10.1f", where, range.c_str(), seconds * 1e6, gbps);
  if (copy_gbps > 0) {
    std::printf(" %9.0f%% %9.0f%%", 100 * gbps / copy_gbps, 100 * gbps * 1e9 / kH200BytesPerSecond);
  }
  std::printf("\n");
}

std::vector<unsigned char> RandomBytes(uint64_t bytes) {
  std::vector<unsigned char> data(bytes);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < bytes; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    data[i] = static_cast<unsigned char>(state);
  }
  return data;
}

void BenchCpu(int runs) {
  const std::vector<unsigned char> data = RandomBytes(256 * kMiB);
  for (uint64_t bytes : {64 * kMiB, 256 * kMiB}) {
    volatile uint64_t sink = 0;
    const double seconds = MedianSeconds(
        runs, [&] { return HostSeconds([&] { sink = FingerprintHost(data.data(), bytes); }); });
    PrintRow("cpu", SizeName(bytes), seconds, bytes, 0);
  }
  // Random bytes hold NaNs and infinities too; the scan's loop is the same for any value.
  for (const ScannedKind& k : kScannedKinds) {
    for (uint64_t bytes : {64 * kMiB, 256 * kMiB}) {
      const int64_t count = static_cast<int64_t>(bytes / k.bytes), stride = 1;
      volatile double sink = 0;
      const double seconds = MedianSeconds(runs, [&] {
        return HostSeconds([&] {
          sink = torchrr::kernels::ScanFiniteHost(data.data(), k.kind, &count, &stride, 1).max_abs;
        });
      });
      PrintRow("cpu", SizeName(bytes) + " " + k.name + " scan", seconds, bytes, 0);
    }
  }
}

#ifdef TORCHRR_KERNELS_CUDA

bool Ok(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return true;
  std::printf("cuda: %s failed: %s; CUDA rows skipped\n", what, cudaGetErrorString(rc));
  return false;
}

// ScanFiniteCudaAsync then ReadFiniteSlotsCuda, next to a copy of the same size. `source` holds
// `host` (64 MiB) then a pattern, up to 1 GiB.
void BenchCudaFinite(int runs, int device, const unsigned char* source, unsigned char* target,
                     const std::vector<unsigned char>& host, cudaStream_t stream, cudaEvent_t start,
                     cudaEvent_t stop) {
  using torchrr::kernels::FiniteScan;
  using torchrr::kernels::FiniteSlot;
  std::string error;
  // Slots accumulate: one fresh slot for each kind's check against the CPU, one for the timings.
  constexpr size_t kTimingSlot = std::size(kScannedKinds);
  FiniteSlot* slots = torchrr::kernels::AllocFiniteSlotsCuda(device, kTimingSlot + 1, &error);
  if (slots == nullptr) {
    std::printf("cuda: AllocFiniteSlotsCuda failed: %s; scan rows skipped\n", error.c_str());
    return;
  }
  // One scan into slots[slot] and its read; false when either fails.
  auto scan = [&](FloatKind kind, int64_t count, size_t slot, FiniteScan* result) {
    const int64_t stride = 1;
    return torchrr::kernels::ScanFiniteCudaAsync(source, kind, &count, &stride, 1, device, stream,
                                                 slots + slot, &error) &&
           torchrr::kernels::ReadFiniteSlotsCuda(slots + slot, 1, device, stream, result, &error);
  };
  for (size_t i = 0; i < std::size(kScannedKinds); ++i) {
    const ScannedKind& k = kScannedKinds[i];
    const int64_t count = static_cast<int64_t>(64 * kMiB / k.bytes), stride = 1;
    FiniteScan on_gpu;
    if (!scan(k.kind, count, i, &on_gpu)) {
      std::printf("cuda: ScanFiniteCudaAsync failed: %s; scan rows skipped\n", error.c_str());
      torchrr::kernels::FreeFiniteSlotsCuda(slots);
      return;
    }
    const FiniteScan on_cpu =
        torchrr::kernels::ScanFiniteReference(host.data(), k.kind, &count, &stride, 1);
    std::printf("cuda: 64 MiB %s scan %s the CPU reference's\n", k.name,
                on_gpu.flags == on_cpu.flags && on_gpu.max_abs == on_cpu.max_abs ? "equals"
                                                                                 : "DIFFERS FROM");
  }
  for (uint64_t bytes : {64 * kMiB, 256 * kMiB, 1024 * kMiB}) {
    bool failed = false;
    const double copy = MedianSeconds(runs, [&] {
      float ms = 0;
      failed |=
          cudaEventRecord(start, stream) != cudaSuccess ||
          cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess ||
          cudaEventRecord(stop, stream) != cudaSuccess ||
          cudaEventSynchronize(stop) != cudaSuccess ||
          cudaEventElapsedTime(&ms, start, stop) != cudaSuccess;
      return ms / 1e3;
    });
    if (failed) {
      std::printf("cuda: %s copy failed\n", SizeName(bytes).c_str());
      continue;
    }
    PrintRow("copy", SizeName(bytes) + " r+w", copy, 2 * bytes, 0);
    for (const ScannedKind& k : kScannedKinds) {
      const double seconds = MedianSeconds(runs, [&] {
        FiniteScan result;
        return HostSeconds([&] { failed |= !scan(k.kind, bytes / k.bytes, kTimingSlot, &result); });
      });
      if (failed) {
        std::printf("cuda: %s %s scan failed: %s\n", SizeName(bytes).c_str(), k.name,
                    error.c_str());
        continue;
      }
      PrintRow("cuda", SizeName(bytes) + " " + k.name + " scan", seconds, bytes,
               2.0 * bytes / copy / 1e9);
    }
  }
  torchrr::kernels::FreeFiniteSlotsCuda(slots);
}

void BenchCuda(int runs) {
  using torchrr::kernels::FingerprintCuda;
  if (!torchrr::kernels::CudaFingerprintAvailable()) {
    std::printf("cuda: no CUDA device; CUDA rows skipped\n");
    return;
  }
  int device = 0;
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDevice(&device), "cudaGetDevice") ||
      !Ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")) {
    return;
  }
  const uint64_t largest = 1024 * kMiB;
  unsigned char* source = nullptr;
  unsigned char* target = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!Ok(cudaMalloc(&source, largest + 64), "cudaMalloc") ||
      !Ok(cudaMalloc(&target, largest), "cudaMalloc") ||
      !Ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !Ok(cudaEventCreate(&start), "cudaEventCreate") ||
      !Ok(cudaEventCreate(&stop), "cudaEventCreate")) {
    return;
  }
  // Random content in the first 64 MiB (checked against the CPU), a pattern after it.
  const std::vector<unsigned char> host = RandomBytes(64 * kMiB + 64);
  if (!Ok(cudaMemset(source, 0x5a, largest + 64), "cudaMemset") ||
      !Ok(cudaMemcpy(source, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy")) {
    return;
  }
  std::printf("cuda: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  uint64_t on_gpu = 0;
  std::string error;
  if (!FingerprintCuda(source, 64 * kMiB, device, stream, &on_gpu, &error)) {
    std::printf("cuda: FingerprintCuda failed: %s; CUDA rows skipped\n", error.c_str());
    return;
  }
  std::printf("cuda: 64 MiB fingerprint %s the CPU's (%016llx)\n",
              on_gpu == FingerprintHost(host.data(), 64 * kMiB) ? "equals" : "DIFFERS FROM",
              static_cast<unsigned long long>(on_gpu));

  struct Case {
    uint64_t bytes;
    uint64_t offset;
  };
  // 4 KiB and 1 MiB show the fixed cost of a call (launches, synchronize).
  for (Case c : {Case{4096, 0}, Case{kMiB, 0}, Case{64 * kMiB, 0}, Case{256 * kMiB, 0},
                 Case{largest, 0}, Case{64 * kMiB, 1}}) {
    bool failed = false;
    error.clear();
    const double copy = MedianSeconds(runs, [&] {
      float ms = 0;
      failed |= cudaEventRecord(start, stream) != cudaSuccess ||
                cudaMemcpyAsync(target, source, c.bytes, cudaMemcpyDeviceToDevice, stream) !=
                    cudaSuccess ||
                cudaEventRecord(stop, stream) != cudaSuccess ||
                cudaEventSynchronize(stop) != cudaSuccess ||
                cudaEventElapsedTime(&ms, start, stop) != cudaSuccess;
      return ms / 1e3;
    });
    const double fingerprint = MedianSeconds(runs, [&] {
      uint64_t value = 0;
      return HostSeconds([&] {
        failed |= !FingerprintCuda(source + c.offset, c.bytes, device, stream, &value, &error);
      });
    });
    if (failed) {
      std::printf("cuda: %s failed: %s\n", SizeName(c.bytes).c_str(),
                  error.empty() ? "a copy or event call" : error.c_str());
      continue;
    }
    const double copy_gbps = 2.0 * c.bytes / copy / 1e9;
    const std::string range = SizeName(c.bytes) + (c.offset != 0 ? " at +1" : "");
    PrintRow("copy", range + " r+w", copy, 2 * c.bytes, 0);
    PrintRow("cuda", range, fingerprint, c.bytes, copy_gbps);
  }
  BenchCudaFinite(runs, device, source, target, host, stream, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(source);
  cudaFree(target);
}

#endif  // TORCHRR_KERNELS_CUDA

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  std::printf(
      "fingerprint v1 and finiteness scans: median of %d runs after a warm-up; "
      "GB = 1e9 bytes\n",
      runs);
  PrintHeader();
  BenchCpu(runs);
#ifdef TORCHRR_KERNELS_CUDA
  BenchCuda(runs);
#else
  std::printf("cuda: built without CUDA; CUDA rows skipped\n");
#endif
  return 0;
}
