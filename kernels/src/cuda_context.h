// Entering a CUDA device for one call, from a thread of a PyTorch process, and leaving the thread
// as it was found (CUDA code only).
//
// torchrr's kernels are linked, with a static CUDA runtime, into a library loaded by a process
// whose own CUDA runtime already holds the devices' primary contexts; both runtimes share those
// contexts. So a call makes its device current and puts back whatever context was current before,
// including none: cudaGetDevice/cudaSetDevice cannot, and setting device 0 back on a thread that
// had no context would create one (and use memory) on device 0.
#ifndef TORCHRR_KERNELS_CUDA_CONTEXT_H_
#define TORCHRR_KERNELS_CUDA_CONTEXT_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

namespace torchrr::kernels::cuda_context {

// "<what>: <description> (<name>)".
inline std::string Describe(cudaError_t rc, const char* what) {
  return std::string(what) + ": " + cudaGetErrorString(rc) + " (" + cudaGetErrorName(rc) + ")";
}

// The driver's cuCtxGetCurrent / cuCtxSetCurrent, looked up through the runtime (no link-time
// dependency on libcuda).
struct DriverContextApi {
  decltype(&cuCtxGetCurrent) get_current = nullptr;
  decltype(&cuCtxSetCurrent) set_current = nullptr;
  std::string error;  // Why they are missing, when they are.
};

inline const DriverContextApi& ContextApi() {
  static const DriverContextApi* api = [] {
    auto* found = new DriverContextApi;  // Process lifetime.
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult get_status{}, set_status{};
    // 12000: the ABI of these two functions since CUDA 12.0 (unchanged since 4.0).
    cudaError_t rc = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000,
                                                      cudaEnableDefault, &get_status);
    if (rc == cudaSuccess) {
      rc = cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                            &set_status);
    }
    if (rc != cudaSuccess) {
      found->error =
          Describe(rc, "cudaGetDriverEntryPointByVersion(cuCtxGetCurrent, cuCtxSetCurrent)");
    } else if (get == nullptr || set == nullptr || get_status != cudaDriverEntryPointSuccess ||
               set_status != cudaDriverEntryPointSuccess) {
      found->error = "the CUDA driver lacks cuCtxGetCurrent or cuCtxSetCurrent";
    } else {
      found->get_current = reinterpret_cast<decltype(&cuCtxGetCurrent)>(get);
      found->set_current = reinterpret_cast<decltype(&cuCtxSetCurrent)>(set);
    }
    return found;
  }();
  return *api;
}

// Makes `device` current on the calling thread for its lifetime, then puts back the context that
// was current before (or none).
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (!entered_) return;
    CUcontext now = nullptr;
    if (api_->get_current(&now) != CUDA_SUCCESS || now != saved_) api_->set_current(saved_);
  }

  // False, with why in *error (no prefix), when the device cannot be made current.
  bool Enter(int device, std::string* error) {
    api_ = &ContextApi();
    if (api_->get_current == nullptr) {
      *error = api_->error;
      return false;
    }
    if (api_->get_current(&saved_) != CUDA_SUCCESS) {
      *error = "cuCtxGetCurrent failed";
      return false;
    }
    entered_ = true;
    const cudaError_t rc = cudaSetDevice(device);
    if (rc != cudaSuccess) {
      *error = Describe(rc, "cudaSetDevice");
      return false;
    }
    return true;
  }

 private:
  const DriverContextApi* api_ = nullptr;
  CUcontext saved_ = nullptr;
  bool entered_ = false;
};

}  // namespace torchrr::kernels::cuda_context

#endif  // TORCHRR_KERNELS_CUDA_CONTEXT_H_
