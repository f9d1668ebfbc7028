// RecordBytes: records as flat bytes, for the hop from the training threads to the writer thread.
//
// A record held as a format::Record owns heap memory (an op's inputs, outputs and arguments, a
// tensor's shape and strides, a node's edges and saved tensors). Queued as such, that memory is
// allocated on the training thread and freed on the writer thread, and glibc then serves every
// allocation on the training thread from its shared arena (the slow path) instead of from the
// thread's own cache. Appended as bytes to the queue instead, each record is freed where it was
// made, right after it is copied, and the queue itself is one growing byte buffer.
//
// This is an in-process encoding, not a file format: both ends are the same build. The trace file
// format is format/'s (SPEC.md); the writer thread decodes these bytes back into records for it.
#ifndef TORCHRR_RECORDER_RECORD_BYTES_H_
#define TORCHRR_RECORDER_RECORD_BYTES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "torchrr/format/records.h"

namespace torchrr::recorder {

// Appends `record` to `out`. Allocates only when `out` grows.
void AppendRecordBytes(const format::Record& record, std::string& out);

// Decodes records from bytes written by AppendRecordBytes, one at a time, into per-kind scratch
// records whose vectors and strings keep their capacity between records.
class RecordBytesReader {
 public:
  RecordBytesReader();

  // Decodes the record at `*pos` in `bytes`, advances `*pos` past it and returns it; the reference
  // stays valid (and may be modified) until the next call. Returns nullptr at the end, or when
  // the bytes are cut or not AppendRecordBytes' (a bug: both ends are this build).
  format::Record* Next(std::string_view bytes, size_t* pos);

 private:
  std::array<format::Record, format::kRecordKindCount> scratch_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_RECORD_BYTES_H_
