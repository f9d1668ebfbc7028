#include "byte_sinks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "container.h"

namespace torchrr::format {
namespace {

Status NotARegularFile(const std::string& path, mode_t mode) {
  const char* what = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISLNK(mode)  ? "a symbolic link"
                                      : "not a file";
  return Status(StatusCode::kInvalidArgument,
                path + ": not a regular file (" + what + "); a trace is written to a file");
}

// Whether the regular file at `path` (`st` its fstat through the writer's descriptor) starts as
// a trace: read through a descriptor of its own (the writer's is write-only), the same file.
Status CheckIsTrace(const std::string& path, const struct stat& st) {
  uint8_t head[sizeof(kFileMagic)] = {};
  ssize_t n = -1;
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat again;
    if (::fstat(fd, &again) == 0 && again.st_dev == st.st_dev && again.st_ino == st.st_ino) {
      n = ::pread(fd, head, sizeof(head), 0);
    }
    ::close(fd);
  }
  const bool trace = n >= 0 && static_cast<size_t>(n) == sizeof(head) &&
                     std::memcmp(head, kFileMagic, sizeof(head)) == 0;
  if (trace) return Status::Ok();
  return Status(StatusCode::kInvalidArgument,
                path + " " + std::string(TraceWriter::kNotReplacedSuffix));
}

// Opens `path` for writing, creating it when `create`, only if it is a regular file, and takes
// the exclusive lock (flock) a writer holds on its trace for as long as the descriptor is open.
// Changes no byte of the file. Returns the descriptor (O_CLOEXEC, blocking), or:
// kInvalidArgument for an empty path, a symbolic link (O_NOFOLLOW: a link planted at the path
// never truncates its target nor creates a file elsewhere) or anything but a regular file;
// kIoError "path: another recording is writing it" when the lock is held, "path: strerror" when
// open fails.
//
// The stat before open keeps it from touching a device or a FIFO (whose open would block until
// a reader came); O_NONBLOCK makes a FIFO put there after that stat fail (ENXIO) instead of
// blocking, and fstat after open refuses whatever it opened that is not a regular file. A file
// system without flock (EINVAL, ENOLCK, EOPNOTSUPP) writes unlocked.
// Unless `replace_any_file`, a file that is neither empty nor a trace (its first bytes are not the
// file magic) is refused with kInvalidArgument: it is the program's, not an old trace.
StatusOr<int> OpenLockedRegularFile(const std::string& path, bool create, bool replace_any_file) {
  if (path.empty()) return Status(StatusCode::kInvalidArgument, "no trace path given (empty)");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return NotARegularFile(path, st.st_mode);
  }
  int flags = O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == ELOOP) return NotARegularFile(path, S_IFLNK);
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
  if (!replace_any_file && st.st_size > 0) {
    if (Status trace = CheckIsTrace(path, st); !trace.ok()) {
      ::close(fd);
      return trace;
    }
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return Status(StatusCode::kIoError, path + ": another recording is writing it");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// `fd` moved to a number far above those a program allocates (the lowest free one), so that a
// program that closes its inherited descriptors and opens files of its own does not get the
// trace's number back. Half the soft descriptor limit, at most 1024; `fd` itself when the limit
// is low or the move fails. The flock goes with the open file description.
int MoveToHighDescriptor(int fd) {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < 64) return fd;
  const rlim_t least = std::min<rlim_t>(1024, limit.rlim_cur / 2);
  if (static_cast<rlim_t>(fd) >= least) return fd;
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(least));
  if (high < 0) return fd;
  ::close(fd);
  return high;
}

}  // namespace

FileSink::FileSink(int fd, std::string path)
    : fd_(MoveToHighDescriptor(fd)), path_(std::move(path)) {
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    device_ = st.st_dev;
    inode_ = st.st_ino;
  }
}

bool FileSink::OwnsDescriptor() const {
  struct stat st;
  return fd_ >= 0 && ::fstat(fd_, &st) == 0 && st.st_dev == device_ && st.st_ino == inode_;
}

Status FileSink::TakeDescriptorBack() {
  if (OwnsDescriptor()) return Status::Ok();
  // The program closed the descriptor (os.closerange, a daemon's setup); its number may now be a
  // file of the program's, which is never written or closed from here.
  // The same open as the first (no link, a regular file, the lock: another recording holding it
  // has truncated the file), and then the same file, or nothing more is written.
  const std::string lost = path_ + ": the program closed the trace's descriptor (" +
                           std::to_string(fd_) + "); nothing more is written: ";
  fd_ = -1;
  StatusOr<int> fd = OpenLockedRegularFile(path_, /*create=*/false, /*replace_any_file=*/true);
  if (!fd.ok()) return Status(StatusCode::kIoError, lost + fd.status().message());
  struct stat st;
  if (::fstat(fd.value(), &st) != 0 || st.st_dev != device_ || st.st_ino != inode_) {
    ::close(fd.value());
    return Status(StatusCode::kIoError, lost + "the path is no longer the trace");
  }
  if (::lseek(fd.value(), static_cast<off_t>(offset_), SEEK_SET) < 0) {
    Status failed(StatusCode::kIoError, lost + "lseek: " + std::strerror(errno));
    ::close(fd.value());
    return failed;
  }
  fd_ = MoveToHighDescriptor(fd.value());
  return Status::Ok();
}

StatusOr<std::unique_ptr<FileSink>> FileSink::Open(const std::string& path,
                                                   bool replace_any_file) {
  StatusOr<int> fd = OpenLockedRegularFile(path, /*create=*/true, replace_any_file);
  if (!fd.ok()) return fd.status();
  // Truncated only under the lock: a second recording to the path never empties the first's.
  if (::ftruncate(fd.value(), 0) != 0) {
    Status truncate_failed(StatusCode::kIoError, path + ": truncate: " + std::strerror(errno));
    ::close(fd.value());
    return truncate_failed;
  }
  return std::unique_ptr<FileSink>(new FileSink(fd.value(), path));
}

Status FileSink::CheckPath(const std::string& path, bool replace_any_file) {
  if (path.empty()) return OpenLockedRegularFile(path, false, replace_any_file).status();
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
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
  StatusOr<int> fd = OpenLockedRegularFile(path, /*create=*/false, replace_any_file);
  if (!fd.ok()) return fd.status();
  ::close(fd.value());
  return Status::Ok();
}

FileSink::~FileSink() {
  if (OwnsDescriptor()) ::close(fd_);
}

Status FileSink::Write(const void* data, size_t size) {
  if (closed_) return Status(StatusCode::kIoError, path_ + ": write after close");
  TORCHRR_RETURN_IF_ERROR(TakeDescriptorBack());
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kIoError, path_ + ": write: " + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset_ += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status FileSink::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  if (!OwnsDescriptor()) {  // Never close what the program opened at the trace's old number.
    fd_ = -1;
    return Status::Ok();
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0 && errno != EINTR) {
    return Status(StatusCode::kIoError, path_ + ": close: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace torchrr::format
