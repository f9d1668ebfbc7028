// Fingerprints of saved tensors, for --verify-saved.
//
// A write that no version counter sees (a raw CUDA kernel on data_ptr, numpy on a CPU tensor's
// memory, a custom extension) changes a saved tensor's bytes without autograd noticing, and the
// gradient is silently wrong. With verify_saved on, the recorder fingerprints (kernels/) the
// bytes each saved tensor spans when the node saves it and again when backward is about to use
// it; the replayer reports a change that no version bump explains as a `silent` violation.
#ifndef TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_
#define TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_

#include <string>

#include <ATen/core/Tensor.h>

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

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_SAVED_FINGERPRINTS_H_
