// The session's CUDA adapter: starts CUPTI when a device is present, and turns what it delivers
// into the session's record groups.
#include <cstdio>
#include <memory>
#include <string>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "session/session.h"

namespace torchrr::recorder {

// Receives CUPTI's records on CUPTI's thread (or the one in Flush/Stop), one buffer at a time,
// never concurrently: interns kernel names and pushes each buffer's records as one group.
class Session::CudaSink : public CudaActivityTracer::Sink {
 public:
  explicit CudaSink(Session* session) : session_(session) {}

  void OnKernel(const format::CudaKernelRecord& record, std::string_view name) override {
    if (record.op == kOwnCudaWork) return;
    format::CudaKernelRecord r = record;
    {
      std::lock_guard<std::mutex> lock(session_->mu_);
      r.name = session_->interner_->String(name, group_);
    }
    group_.Add(r);
  }
  void OnMemcpy(const format::CudaMemcpyRecord& record) override {
    if (record.op != kOwnCudaWork) group_.Add(record);
  }
  void OnDataLoss(uint64_t records, std::string_view reason) override {
    int64_t now = NowNs();
    group_.Add(format::DataLossRecord{records, 0, now, now, std::string(reason)});
  }
  void OnDeliveryEnd() override {
    if (!group_.empty() && session_->recording()) {
      std::lock_guard<std::mutex> lock(session_->mu_);
      session_->PushGroupLocked(group_);
    }
    group_.clear();
  }

 private:
  Session* session_;
  EncodedRecords group_;  // CUPTI delivery only.
};

void Session::StartCudaTracer() {
  if (!options_.cuda_kernels || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ||
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() <= 0) {
    return;  // No CUDA device: nothing to trace, and nothing to warn about.
  }
  CuptiApi api;
  std::string why_not;
  cuda_sink_ = std::make_unique<CudaSink>(this);
  if (LoadCupti(&api, &why_not)) {
    cuda_tracer_ = CudaActivityTracer::Start(api, cuda_sink_.get(), &NowNs, &why_not);
  }
  if (!cuda_tracer_) {
    std::fprintf(stderr, "torchrr: warning: CUDA kernels not recorded: %s\n", why_not.c_str());
  }
}

// CUPTI hands over full buffers on its own; a flush about once a second keeps a crashed run's
// trace close to complete. One thread flushes, outside every lock (delivery takes mu_).
void Session::MaybeFlushCuda() {
  int64_t now = NowNs();
  int64_t last = last_cuda_flush_ns_.load(std::memory_order_relaxed);
  if (now - last < 1'000'000'000) return;
  if (!last_cuda_flush_ns_.compare_exchange_strong(last, now)) return;
  cuda_tracer_->Flush();
}

}  // namespace torchrr::recorder
