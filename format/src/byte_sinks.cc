#include "byte_sinks.h"

#include <fcntl.h>
#include <sys/file.h>
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
                                      : "not a file";
  return Status(StatusCode::kInvalidArgument,
                path + ": not a regular file (" + what + "); a trace is written to a file");
}

// Opens `path` for writing, creating it when `create`, only if it is a regular file, and takes
// the exclusive lock (flock) a writer holds on its trace for as long as the descriptor is open.
// Changes no byte of the file. Returns the descriptor (O_CLOEXEC, blocking), or:
// kInvalidArgument for an empty path or anything but a regular file; kIoError "path: another
// recording is writing it" when the lock is held, "path: strerror" when open fails.
//
// The stat before open keeps it from touching a device or a FIFO (whose open would block until
// a reader came); O_NONBLOCK makes a FIFO put there after that stat fail (ENXIO) instead of
// blocking, and fstat after open refuses whatever it opened that is not a regular file. A file
// system without flock (EINVAL, ENOLCK, EOPNOTSUPP) writes unlocked.
StatusOr<int> OpenLockedRegularFile(const std::string& path, bool create) {
  if (path.empty()) return Status(StatusCode::kInvalidArgument, "no trace path given (empty)");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return NotARegularFile(path, st.st_mode);
  }
  int flags = O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == ENXIO) return NotARegularFile(path, S_IFIFO);
    if (errno == EISDIR) return NotARegularFile(path, S_IFDIR);
    return Status(StatusCode::kIoError, path + ": " + std::strerror(errno));
  }
  if (::fstat(fd, &st) != 0) {
    Status failed(StatusCode::kIoError, path + ": fstat: " + std::strerror(errno));
    ::close(fd);
    return failed;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotARegularFile(path, st.st_mode);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return Status(StatusCode::kIoError, path + ": another recording is writing it");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<FileSink>> FileSink::Open(const std::string& path) {
  StatusOr<int> fd = OpenLockedRegularFile(path, /*create=*/true);
  if (!fd.ok()) return fd.status();
  // Truncated only under the lock: a second recording to the path never empties the first's.
  if (::ftruncate(fd.value(), 0) != 0) {
    Status truncate_failed(StatusCode::kIoError, path + ": truncate: " + std::strerror(errno));
    ::close(fd.value());
    return truncate_failed;
  }
  return std::unique_ptr<FileSink>(new FileSink(fd.value(), path));
}

Status FileSink::CheckPath(const std::string& path) {
  if (path.empty()) return OpenLockedRegularFile(path, false).status();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
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
  StatusOr<int> fd = OpenLockedRegularFile(path, /*create=*/false);
  if (!fd.ok()) return fd.status();
  ::close(fd.value());
  return Status::Ok();
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
