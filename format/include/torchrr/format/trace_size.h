// How many bytes a trace's records take decompressed, from its chunk headers, before any is
// decompressed: what a reader's memory is measured against.
#ifndef TORCHRR_FORMAT_TRACE_SIZE_H_
#define TORCHRR_FORMAT_TRACE_SIZE_H_

#include <cstdint>
#include <string>

namespace torchrr::format {

// The sum of the raw (decompressed) lengths of the chunks of the trace at `path` whose checksum
// verifies, found as the reader finds them: one after another from the file header, and past
// damage at the next chunk magic. Reads each chunk's compressed bytes once (for the checksum),
// never decompresses; a chunk claiming more than the format's maximum counts nothing. 0 when the
// file cannot be read or holds no chunk. Thread-safe.
uint64_t DecompressedTraceBytes(const std::string& path);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_TRACE_SIZE_H_
