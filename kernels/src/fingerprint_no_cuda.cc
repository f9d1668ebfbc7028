// fingerprint.h's CUDA entry points in a build without a CUDA compiler.
#include "torchrr/kernels/fingerprint.h"

namespace torchrr::kernels {

bool CudaFingerprintAvailable() { return false; }

bool FingerprintCuda(const void*, size_t, int, void*, uint64_t*, std::string* error) {
  if (error != nullptr) *error = "this torchrr was built without CUDA (no nvcc found)";
  return false;
}

}  // namespace torchrr::kernels
