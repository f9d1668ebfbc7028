#include "torchrr/format/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace torchrr::format {
namespace {

Status NotARegularFile(const std::string& path, mode_t mode) {
  const char* what = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISLNK(mode)  ? "a symbolic link, not written through"
                                      : "not a file";
  return Status(StatusCode::kInvalidArgument, path + ": not a regular file (" + what +
                                                  "); torchrr writes its outputs to files");
}

// Whether the regular file at `path` (`st` its fstat through the writer's descriptor) starts with
// `prefix`: read through a descriptor of its own (the writer's is write-only), checked to be the
// same file.
bool StartsWith(const std::string& path, const struct stat& st, std::string_view prefix) {
  std::string head(prefix.size(), '\0');
  ssize_t n = -1;
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat again;
    if (::fstat(fd, &again) == 0 && again.st_dev == st.st_dev && again.st_ino == st.st_ino) {
      n = ::pread(fd, head.data(), head.size(), 0);
    }
    ::close(fd);
  }
  return !prefix.empty() && n == static_cast<ssize_t>(head.size()) && head == prefix;
}

}  // namespace

StatusOr<int> OpenOutputFile(const std::string& path, const OutputFileOptions& options,
                             bool create, bool truncate) {
  if (path.empty()) return Status(StatusCode::kInvalidArgument, "no output path given (empty)");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return NotARegularFile(path, st.st_mode);
  }
  // Never O_TRUNC: the file is emptied only once it is known to be one that may be.
  int flags = O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == ELOOP) return NotARegularFile(path, S_IFLNK);
    if (errno == ENXIO) return NotARegularFile(path, S_IFIFO);
    if (errno == EISDIR) return NotARegularFile(path, S_IFDIR);
    return Status(StatusCode::kIoError, path + ": " + std::strerror(errno));
  }
  Status refused;
  if (::fstat(fd, &st) != 0) {
    refused = Status(StatusCode::kIoError, path + ": fstat: " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    refused = NotARegularFile(path, st.st_mode);
  } else if (!options.replace_any_file && st.st_size > 0 &&
             !StartsWith(path, st, options.own_prefix)) {
    refused = Status(StatusCode::kInvalidArgument,
                     path + " " + std::string(options.not_own) + std::string(kNotReplaced));
  } else if (truncate && ::ftruncate(fd, 0) != 0) {
    refused = Status(StatusCode::kIoError, path + ": truncate: " + std::strerror(errno));
  }
  if (!refused.ok()) {
    ::close(fd);
    return refused;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Status CheckOutputFile(const std::string& path, const OutputFileOptions& options) {
  struct stat st;
  if (!path.empty() && ::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status(StatusCode::kIoError, path + ": " + std::strerror(errno));
    // A new file: its directory must take one.
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return Status(StatusCode::kIoError,
                    path + ": cannot be created: " + dir.string() + ": " + std::strerror(errno));
    }
    return Status::Ok();
  }
  StatusOr<int> fd = OpenOutputFile(path, options, /*create=*/false, /*truncate=*/false);
  if (!fd.ok()) return fd.status();
  ::close(fd.value());
  return Status::Ok();
}

Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status(StatusCode::kIoError,
                    path + ": write: " + (n < 0 ? std::strerror(errno) : "nothing written"));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// 64 KiB: few enough system calls for a multi-gigabyte export, little memory.
constexpr size_t kOutputBufferBytes = 64 << 10;

OutputFileBuffer::OutputFileBuffer(int fd, std::string path)
    : fd_(fd), path_(std::move(path)), buffer_(kOutputBufferBytes, '\0') {
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

OutputFileBuffer::~OutputFileBuffer() { (void)Close(); }

bool OutputFileBuffer::Drain() {
  const size_t pending = static_cast<size_t>(pptr() - pbase());
  if (status_.ok() && pending > 0) status_ = WriteAll(fd_, pbase(), pending, path_);
  setp(buffer_.data(), buffer_.data() + buffer_.size());
  return status_.ok();
}

OutputFileBuffer::int_type OutputFileBuffer::overflow(int_type c) {
  if (!Drain()) return traits_type::eof();
  if (!traits_type::eq_int_type(c, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(c);
    pbump(1);
  }
  return traits_type::not_eof(c);
}

int OutputFileBuffer::sync() { return Drain() ? 0 : -1; }

Status OutputFileBuffer::Close() {
  if (fd_ < 0) return status_;
  Drain();
  if (::close(fd_) != 0 && errno != EINTR && status_.ok()) {
    status_ = Status(StatusCode::kIoError, path_ + ": close: " + std::strerror(errno));
  }
  fd_ = -1;
  return status_;
}

}  // namespace torchrr::format
