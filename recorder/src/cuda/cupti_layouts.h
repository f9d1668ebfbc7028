// The CUPTI activity record layouts torchrr reads, as the cupti.h it is built with names them
// (cupti_tracer.cc reads them; its test writes them). A newer libcupti writes newer versions of
// them, which only ever append fields: those read keep their offsets (the kernel's name sits at
// byte 104 from CUpti_ActivityKernel4 to 10). Include after <cupti.h>.
#ifndef TORCHRR_RECORDER_CUPTI_LAYOUTS_H_
#define TORCHRR_RECORDER_CUPTI_LAYOUTS_H_

#include <cstdint>

namespace torchrr::recorder {

#if CUPTI_API_VERSION >= 130000
using KernelActivity = CUpti_ActivityKernel10;
using MemcpyActivity = CUpti_ActivityMemcpy6;
inline constexpr uint32_t kMinCuptiVersion = 130000;  // CUDA 13's first: older lay records apart.
#else
using KernelActivity = CUpti_ActivityKernel9;  // CUDA 12's newest.
using MemcpyActivity = CUpti_ActivityMemcpy5;
inline constexpr uint32_t kMinCuptiVersion = 0;
#endif

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_CUPTI_LAYOUTS_H_
