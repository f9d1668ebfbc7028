// Reading a torchrr trace: every chunk is checksummed and every FlatBuffer verified before use,
// every length is checked against the bytes left and a maximum before anything is allocated, and no
// input crashes the reader.
//
// A file cut short gives back every whole chunk before the cut (status kTruncated, "truncated after
// chunk N"); a corrupt chunk is reported with its number and byte offset and the reader resumes at
// the next chunk that verifies (status kCorrupt), so a broken trace gives back all that still
// verifies. A newer major format is refused (kTooNew) with both versions in the message.
//
// Records come in the order the writer wrote them, also when chunks were moved: a record chunk
// that does not continue the one read before it (SPEC.md, "Reading") is held until the one it
// continues has been read, and a chunk that is a copy of an earlier one is dropped (both kCorrupt).
// The work is linear in the file's size whatever the input (checksummed_bytes).
#ifndef TORCHRR_FORMAT_READER_H_
#define TORCHRR_FORMAT_READER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/format/status.h"
#include "torchrr/format/version.h"

namespace torchrr::format {

struct FileHeader {
  uint16_t major = 0;
  uint16_t minor = 0;
  uint16_t oldest_reader_major = 0;  // The oldest reader version that can read this file.
  uint16_t oldest_reader_minor = 0;
};

struct ChunkInfo {
  uint64_t offset = 0;          // Byte offset of the chunk header in the file.
  uint16_t type = 0;
  uint32_t compressed_bytes = 0;
  uint32_t raw_bytes = 0;
  uint32_t records = 0;
};

struct ReadSummary {
  Status status;                 // The worst thing that happened; data may still have been returned.
  std::vector<std::string> warnings;  // Every problem, in file order.
  FileHeader header;
  FileInfo info;
  bool has_info = false;
  bool has_index = false;        // The file was closed cleanly (index and trailer verified).
  uint64_t file_size = 0;
  uint64_t compressed_bytes = 0; // Sum over record chunks of the compressed payload.
  uint64_t raw_bytes = 0;
  std::vector<ChunkInfo> chunks; // Every chunk that verified, in file order.
  // Bytes run through the chunk checksum, whether they matched or not: at most
  // 9 x file_size + 128 MiB, however the file was damaged or crafted.
  uint64_t checksummed_bytes = 0;
  std::array<uint64_t, kRecordKindCount> records_per_kind{};
  uint64_t records() const;
};

using RecordCallback = std::function<void(const Record&)>;

// A push parser: feed it the file's bytes in pieces of any size; it calls `on_record` for each
// record of each chunk as soon as the chunk is whole and verified and comes next in sequence (one
// out of order waits for the chunk it continues, or for Finish()). Finish() says how the file
// ended. The records and the summary do not depend on the size of the pieces.
class TraceParser {
 public:
  explicit TraceParser(RecordCallback on_record);
  ~TraceParser();
  TraceParser(const TraceParser&) = delete;
  TraceParser& operator=(const TraceParser&) = delete;

  // Returns false once parsing cannot go on (not a trace, too new); Finish() says why.
  bool Feed(const void* data, size_t size);
  // The end of the input: settles truncation and the index. Call once.
  ReadSummary Finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads a whole file through TraceParser. A missing or unreadable file is kNotATrace with strerror.
ReadSummary ReadTraceFile(const std::string& path, const RecordCallback& on_record);
ReadSummary ReadTraceBytes(std::string_view bytes, const RecordCallback& on_record);

// Convenience for tests and small tools: every record in memory.
struct Trace {
  ReadSummary summary;
  std::vector<Record> records;
};
Trace ReadTraceFileAll(const std::string& path);
Trace ReadTraceBytesAll(std::string_view bytes);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_READER_H_
