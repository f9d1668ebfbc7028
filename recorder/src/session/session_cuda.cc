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
    if (!group_.empty() &&
        (session_->recording() || session_->draining_cuda_.load(std::memory_order_acquire))) {
      std::lock_guard<std::mutex> lock(session_->mu_);
      session_->PushGroupLocked(group_);
    }
    group_.clear();
  }

 private:
  Session* session_;
  EncodedRecords group_;  // CUPTI delivery only.
};

namespace {

bool TouchesCuda(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().is_cuda();
  if (value.isDevice()) return value.toDevice().is_cuda();
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) {
      if (t.is_cuda()) return true;
    }
  }
  return false;
}

}  // namespace

void Session::MaybeStartCudaTracer(c10::ArrayRef<const c10::IValue> inputs) {
  bool cuda = false;
  for (const c10::IValue& input : inputs) {
    if (TouchesCuda(input)) {
      cuda = true;
      break;
    }
  }
  // A .cuda() or a factory with device="cuda" names the device; its kernels come after this. One
  // op starts it: the one that clears cuda_pending_.
  if (cuda && recording() && cuda_pending_.exchange(false, std::memory_order_acq_rel)) {
    StartCudaTracer();
  }
}

void Session::StartCudaTracer() {
  CuptiApi api;
  std::string why_not;
  cuda_sink_ = std::make_unique<CudaSink>(this);
  if (LoadCupti(&api, &why_not)) {
    cuda_tracer_owner_ = CudaActivityTracer::Start(api, cuda_sink_.get(), &NowNs, &why_not);
  }
  if (!cuda_tracer_owner_) {
    std::fprintf(stderr, "torchrr: warning: CUDA kernels not recorded: %s\n", why_not.c_str());
    return;
  }
  last_cuda_flush_ns_.store(NowNs(), std::memory_order_relaxed);
  cuda_tracer_.store(cuda_tracer_owner_.get(), std::memory_order_release);
}

// CUPTI hands over full buffers on its own; a flush about once a second keeps a crashed run's
// trace close to complete. One thread flushes, outside every lock (delivery takes mu_).
void Session::MaybeFlushCuda() {
  int64_t now = NowNs();
  int64_t last = last_cuda_flush_ns_.load(std::memory_order_relaxed);
  if (now - last < 1'000'000'000) return;
  if (!last_cuda_flush_ns_.compare_exchange_strong(last, now)) return;
  if (CudaActivityTracer* cuda = cuda_tracer()) cuda->Flush();
}

}  // namespace torchrr::recorder
