// The trace's FileInfo for a recording: who recorded what, where and when (format/SPEC.md).
#ifndef TORCHRR_RECORDER_FILE_INFO_H_
#define TORCHRR_RECORDER_FILE_INFO_H_

#include "torchrr/format/records.h"
#include "torchrr/recorder.h"

namespace torchrr::recorder {

// This process's: torchrr's and torch's versions, host, pid, rank (options.rank, else RANK),
// WORLD_SIZE, the start time and the command line.
format::FileInfo MakeFileInfo(const RecorderOptions& options);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_FILE_INFO_H_
