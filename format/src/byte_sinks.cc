#include "byte_sinks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace torchrr::format {

StatusOr<std::unique_ptr<FileSink>> FileSink::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status(StatusCode::kIoError, path + ": " + std::strerror(errno));
  return std::unique_ptr<FileSink>(new FileSink(fd, path));
}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

Status FileSink::Write(const void* data, size_t size) {
  if (fd_ < 0) return Status(StatusCode::kIoError, path_ + ": write after close");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kIoError, path_ + ": write: " + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileSink::Close() {
  if (fd_ < 0) return Status::Ok();
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0 && errno != EINTR) {
    return Status(StatusCode::kIoError, path_ + ": close: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace torchrr::format
