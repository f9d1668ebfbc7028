// Fingerprints of saved tensors, for --verify-saved.
//
// A write that no version counter sees (a raw CUDA kernel on data_ptr, numpy on a CPU tensor's
// memory, a custom extension) changes a saved tensor's bytes without autograd noticing, and the
// gradient is silently wrong. With verify_saved on, the recorder fingerprints (kernels/) the
// bytes each saved tensor spans when the node saves it and again when backward is about to use
// it; the replayer reports a change that no version bump explains as a `silent` violation.
#ifndef TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_
#define TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "cuda/cupti_tracer.h"
#include "sink/record_bytes.h"
#include "session/thread_state.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

enum class FingerprintResult {
  kDone,         // out->byte_offset, byte_length and hash are set.
  kNotReadable,  // No bytes to read here (no storage, a meta or unsupported device): skip it.
  kFailed,       // A CUDA call failed; *error says why.
};

// Fingerprints the bytes of `tensor`'s storage that its elements span: from its first element to
// its last, in the storage's byte offsets (so a strided view covers the gaps between its elements
// too). CPU tensors are hashed on the calling thread; CUDA tensors on the tensor's device, on the
// current stream of that device, after the work already queued there (the call waits). Never
// throws.
FingerprintResult FingerprintTensorBytes(const at::Tensor& tensor, format::FingerprintRecord* out,
                                         std::string* error);

// The fingerprint of `bytes` bytes at `data`: host memory when `device` is -1, else memory of CUDA
// device `device`, hashed on that device's current stream after the work queued there (the call
// waits). False, with *error, when a CUDA call fails or this build has no CUDA. Never throws.
bool FingerprintBytes(const void* data, size_t bytes, int device, uint64_t* fingerprint,
                      std::string* error);

// The fingerprints a recording takes: queued while the session's lock is held (where the saved
// tensors are found), computed after it is released (hashing bytes, on CUDA a kernel and a wait,
// blocks no other thread). Queues are the calling thread's (ThreadState::fingerprints). A failure
// turns fingerprints off for the rest of the recording, with one warning.
class SavedFingerprints {
 public:
  explicit SavedFingerprints(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // True until a fingerprint fails; read by whoever records what fingerprints need.
  const std::atomic<bool>& enabled_flag() const { return enabled_; }

  // Queues the fingerprint of one saved tensor (`node`'s saved `name`, at `list_index`) on the
  // calling thread, which is inside a callback (its ThreadState exists).
  void Queue(format::ObjectId node, format::InternId name, uint32_t list_index,
             const at::Tensor& data, format::ObjectId tensor, format::ObjectId storage,
             format::FingerprintWhen when);
  // Computes what `ts` queued and appends their FingerprintRecords to `out` (nothing for bytes it
  // cannot read). `cuda`, when given, is told which CUDA work is torchrr's own.
  void Take(ThreadState& ts, CudaActivityTracer* cuda, EncodedRecords& out);

 private:
  std::atomic<bool> enabled_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_
