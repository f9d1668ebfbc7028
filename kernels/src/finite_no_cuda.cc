// finite.h's CUDA entry points in a build without a CUDA compiler.
#include "torchrr/kernels/finite.h"

namespace torchrr::kernels {
namespace {

bool NoCuda(std::string* error) {
  if (error != nullptr) *error = "this torchrr was built without CUDA (no nvcc found)";
  return false;
}

}  // namespace

bool CudaFiniteAvailable() { return false; }

FiniteSlot* AllocFiniteSlotsCuda(int, size_t, std::string* error) {
  NoCuda(error);
  return nullptr;
}

void FreeFiniteSlotsCuda(FiniteSlot*) {}

bool ScanFiniteCudaAsync(const void*, FloatKind, const int64_t*, const int64_t*, int, int, void*,
                         FiniteSlot*, std::string* error) {
  return NoCuda(error);
}

bool ReadFiniteSlotsCuda(const FiniteSlot*, size_t, int, void*, FiniteScan*, std::string* error) {
  return NoCuda(error);
}

}  // namespace torchrr::kernels
