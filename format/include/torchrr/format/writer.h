// TraceWriter: streams records into a torchrr trace file.
//
// The caller appends records; the writer encodes them into the current chunk (a FlatBuffers
// RecordBatch) and, when the chunk reaches its target size or on Flush(), compresses it into one
// zstd frame and writes it with write(2): a process killed with SIGKILL after a Flush() keeps every
// chunk flushed before the kill. Close() writes the chunk index and the trailer that points at it.
//
// Not thread-safe: one thread (the recorder's writer thread) owns a TraceWriter.
#ifndef TORCHRR_FORMAT_WRITER_H_
#define TORCHRR_FORMAT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "torchrr/format/records.h"
#include "torchrr/format/status.h"

namespace torchrr::format {

struct WriterOptions {
  // 16 MiB of raw FlatBuffers per chunk at most. Each chunk is coded afresh (it decodes alone), so
  // its first step repeats nothing before it; the larger the chunk, the more steps zstd sees
  // repeat within one frame (the PEFT sample's 1,000 steps: 12.3 MB in 4 MiB chunks, 9.0 MB in
  // 16 MiB; format/SPEC.md "Chunk"). A recorder also cuts one every 500 ms, which bounds what a
  // run killed outright loses. The writer's memory grows with it: on the PEFT sample its peak
  // RSS is about 22 MiB above what 4 MiB chunks take (docs/benchmarks.md, bench_keep_last).
  size_t chunk_raw_bytes = 16u << 20;
  int zstd_level = 1;
  // Step coding (format 1.10, with recent ids 1.11, record offset deltas 1.12, recent ids by
  // kind 1.13, node execution times from their op's 1.14 and times from the previous steps' 1.15;
  // SPEC.md "Step coding"): a repeating training step repeats byte for byte, for zstd to remove.
  // Off, the batches code as format 1.0 to 1.9 did, and readers from 1.0 on read the file; on,
  // readers from 1.15 on.
  bool step_coding = true;
  // Open() replaces only a trace or an empty file unless this is set: an output path that names
  // the program's own script (`record -o train.py`) is refused instead of destroyed.
  bool replace_any_file = false;
};

// Where the bytes go. FileSink writes to a file descriptor; tests and benchmarks use memory.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // Writes all of data or fails (disk full, closed descriptor).
  virtual Status Write(const void* data, size_t size) = 0;
  virtual Status Close() { return Status::Ok(); }
};

class TraceWriter {
 public:
  // Creates (truncates) `path` and writes the file header and the FileInfo chunk. The file is
  // locked (flock LOCK_EX) until the writer closes: a second writer of the same path fails, and
  // leaves the first one's file whole (it is truncated only once locked).
  // Errors: kInvalidArgument for an empty path or one that names anything but a regular file (a
  // FIFO, a directory, a device: never opened in a way that could block), or a file that is
  // neither empty nor a trace (its first bytes) unless options.replace_any_file, with
  // kNotReplacedSuffix at the end of the message; kIoError "path: another recording is writing
  // it" when locked, else the path and strerror.
  static StatusOr<std::unique_ptr<TraceWriter>> Open(const std::string& path, const FileInfo& info,
                                                     const WriterOptions& options = {});
  // Whether Open(path) would succeed now, for a command line that refuses a bad output before it
  // starts the program that writes it: Open's errors, and kIoError when `path` does not exist
  // and its directory cannot take a new file. Creates, locks and changes nothing (it takes the
  // lock and lets it go at once when the file exists). Thread-safe.
  static Status CheckPath(const std::string& path, bool replace_any_file = false);
  // The end of the message of the error for an existing file that is not a trace: a command line
  // that has a flag to replace it anyway says so after it.
  static constexpr const char* kNotReplacedSuffix = "is not a torchrr trace: not replaced";
  // Same, into any sink (the writer owns it).
  static StatusOr<std::unique_ptr<TraceWriter>> Create(std::unique_ptr<ByteSink> sink,
                                                       const FileInfo& info,
                                                       const WriterOptions& options = {});
  // Appends into `out` (the string must outlive the writer).
  static std::unique_ptr<TraceWriter> ToString(std::string* out, const FileInfo& info,
                                               const WriterOptions& options = {});

  ~TraceWriter();  // Closes if the caller did not; errors are dropped.
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Encodes one record into the current chunk; writes the chunk when it is full.
  // After an error every later call returns the same error.
  Status Append(const Record& record);
  // Ends the current chunk (if it has records) and writes it.
  Status Flush();
  // Flushes, writes the index and the trailer, closes the sink. Idempotent.
  Status Close();

  uint64_t records_written() const;  // Records in chunks written so far.
  uint64_t bytes_written() const;    // File bytes so far.
  uint64_t raw_bytes_written() const;  // Uncompressed chunk payload bytes so far.
  uint64_t chunks_written() const;
  // Raw bytes of the chunk being built (not yet written).
  size_t pending_raw_bytes() const;

 private:
  class Impl;
  explicit TraceWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_WRITER_H_
