// The ByteSinks behind TraceWriter::Open and TraceWriter::ToString. Internal to format/.
#ifndef TORCHRR_FORMAT_SRC_BYTE_SINKS_H_
#define TORCHRR_FORMAT_SRC_BYTE_SINKS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "torchrr/format/writer.h"

namespace torchrr::format {

// Writes to a file descriptor it owns with write(2): no user-space buffer, so what a Write
// returned from is in the kernel and survives the process being killed.
//
// The descriptor lives in a process it does not own: a recorded program may close it
// (`os.closerange`) and get its number back for a file of its own. Before each write the sink
// checks that the descriptor is still the file it created (device and inode); when it is not,
// it never touches that number again and reopens the trace by path (O_NOFOLLOW), only if the
// path is still that same file, at the offset it had written to. Otherwise Write fails and the
// recording stops with the error. The descriptor sits at a high number (MoveToHighDescriptor),
// which makes a close-and-reopen between the check and the write as unlikely as it can be.
class FileSink : public ByteSink {
 public:
  // Creates or truncates `path`, a regular file, and holds an exclusive flock on it until Close,
  // so that a second writer of the same path fails instead of truncating this one's file.
  // Errors as TraceWriter::Open says.
  static StatusOr<std::unique_ptr<FileSink>> Open(const std::string& path, bool replace_any_file);
  // TraceWriter::CheckPath.
  static Status CheckPath(const std::string& path, bool replace_any_file);
  ~FileSink() override;

  Status Write(const void* data, size_t size) override;
  Status Close() override;

 private:
  FileSink(int fd, std::string path);
  // Whether fd_ is still the file Open created.
  bool OwnsDescriptor() const;
  // Ok when fd_ is the trace, possibly reopened by path; the error otherwise (fd_ is then -1).
  Status TakeDescriptorBack();

  int fd_;
  std::string path_;
  dev_t device_ = 0;  // The trace's identity, from fstat at open.
  ino_t inode_ = 0;
  uint64_t offset_ = 0;  // Bytes written: where a reopened descriptor resumes.
  bool closed_ = false;
};

// Appends to a string the caller owns.
class StringSink : public ByteSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  Status Write(const void* data, size_t size) override {
    out_->append(static_cast<const char*>(data), size);
    return Status::Ok();
  }

 private:
  std::string* out_;
};

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_SRC_BYTE_SINKS_H_
