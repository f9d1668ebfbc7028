// The recorder's names for format's RecordBytes (torchrr/format/record_bytes.h): the queue encoding
// between the training threads and the writer thread.
#ifndef TORCHRR_RECORDER_RECORD_BYTES_H_
#define TORCHRR_RECORDER_RECORD_BYTES_H_

#include "torchrr/format/record_bytes.h"

namespace torchrr::recorder {

using format::AppendRecordBytes;
using format::ByteBuffer;
using format::EncodedRecords;
using format::RecordBytesReader;

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_RECORD_BYTES_H_
