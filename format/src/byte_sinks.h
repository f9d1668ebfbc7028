// The ByteSinks behind TraceWriter::Open and TraceWriter::ToString. Internal to format/.
#ifndef TORCHRR_FORMAT_SRC_BYTE_SINKS_H_
#define TORCHRR_FORMAT_SRC_BYTE_SINKS_H_

#include <string>

#include "torchrr/format/writer.h"

namespace torchrr::format {

// Writes to a file descriptor it owns with write(2): no user-space buffer, so what a Write
// returned from is in the kernel and survives the process being killed.
class FileSink : public ByteSink {
 public:
  // Creates or truncates `path`, a regular file, and holds an exclusive flock on it until Close,
  // so that a second writer of the same path fails instead of truncating this one's file.
  // Errors as TraceWriter::Open says.
  static StatusOr<std::unique_ptr<FileSink>> Open(const std::string& path);
  // TraceWriter::CheckPath.
  static Status CheckPath(const std::string& path);
  ~FileSink() override;

  Status Write(const void* data, size_t size) override;
  Status Close() override;

 private:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
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
