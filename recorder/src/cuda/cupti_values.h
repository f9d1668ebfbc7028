// CUPTI's values, for the tracer's parts (cupti_tracer.cc, cupti_loader.cc, cupti_records.cc).
#ifndef TORCHRR_RECORDER_CUPTI_VALUES_H_
#define TORCHRR_RECORDER_CUPTI_VALUES_H_

#include <cstdint>
#include <limits>

#include "cuda/cupti_tracer.h"

#if TORCHRR_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>
#endif

namespace torchrr::recorder::cupti {

// CUPTI's values, spelled here so that everything but the reading of records and the loader
// builds without cupti.h; checked against it below when it is there.
constexpr CuptiApi::Result kSuccess = 0;
constexpr CuptiApi::Result kErrorMaxLimitReached = 12;
constexpr CuptiApi::Result kErrorInvalidKind = 21;
constexpr CuptiApi::Result kErrorInsufficientPrivileges = 35;
constexpr int kKindMemcpy = 1;
constexpr int kKindMemset = 2;
constexpr int kKindKernel = 3;
constexpr int kKindDriver = 4;
constexpr int kKindRuntime = 5;
constexpr int kKindConcurrentKernel = 10;
constexpr int kKindMemcpy2 = 22;
constexpr int kKindExternalCorrelation = 39;
constexpr uint32_t kFlushForced = 1;  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
// CUPTI API version from which a refused buffer request is safe (CUDA 12.9), per libkineto.
constexpr uint32_t kCanRefuseBuffersFromVersion = 27;

#if TORCHRR_HAVE_CUPTI
static_assert(sizeof(CUptiResult) == sizeof(CuptiApi::Result));
static_assert(sizeof(CUpti_ActivityKind) == sizeof(int));
static_assert(sizeof(CUpti_ExternalCorrelationKind) == sizeof(int));
static_assert(sizeof(CUcontext) == sizeof(void*));
static_assert(CUPTI_SUCCESS == kSuccess);
static_assert(CUPTI_ERROR_MAX_LIMIT_REACHED == kErrorMaxLimitReached);
static_assert(CUPTI_ERROR_INVALID_KIND == kErrorInvalidKind);
static_assert(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES == kErrorInsufficientPrivileges);
static_assert(CUPTI_ACTIVITY_KIND_MEMCPY == kKindMemcpy);
static_assert(CUPTI_ACTIVITY_KIND_MEMSET == kKindMemset);
static_assert(CUPTI_ACTIVITY_KIND_KERNEL == kKindKernel);
static_assert(CUPTI_ACTIVITY_KIND_DRIVER == kKindDriver);
static_assert(CUPTI_ACTIVITY_KIND_RUNTIME == kKindRuntime);
static_assert(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL == kKindConcurrentKernel);
static_assert(CUPTI_ACTIVITY_KIND_MEMCPY2 == kKindMemcpy2);
static_assert(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION == kKindExternalCorrelation);
static_assert(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED == kFlushForced);
static_assert(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2 == CudaActivityTracer::kExternalKind);
static_assert(ACTIVITY_RECORD_ALIGNMENT == CudaActivityTracer::kBufferAlignment);

#endif  // TORCHRR_HAVE_CUPTI

// A CUPTI device id as the trace's device index (-1 when it does not fit).
inline int8_t DeviceIndex(uint32_t device) {
  return device <= static_cast<uint32_t>(std::numeric_limits<int8_t>::max())
             ? static_cast<int8_t>(device)
             : int8_t{-1};
}

}  // namespace torchrr::recorder::cupti

#endif  // TORCHRR_RECORDER_CUPTI_VALUES_H_
