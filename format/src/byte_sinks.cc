#include "byte_sinks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "container.h"
#include "torchrr/format/output_file.h"

namespace torchrr::format {
namespace {

// A trace output: an existing file is replaced only when it starts with the file magic.
OutputFileOptions TraceOutput(bool replace_any_file) {
  OutputFileOptions options;
  options.own_prefix =
      std::string_view(reinterpret_cast<const char*>(kFileMagic), sizeof(kFileMagic));
  options.not_own = "is not a torchrr trace";
  options.replace_any_file = replace_any_file;
  return options;
}

// Opens `path` for writing as OpenOutputFile does (creating it when `create`, truncating
// nothing), and takes the exclusive lock (flock) a writer holds on its trace for as long as the
// descriptor is open. Returns the descriptor, OpenOutputFile's errors, or kIoError "path: another
// recording is writing it" when the lock is held. A file system without flock (EINVAL, ENOLCK,
// EOPNOTSUPP) writes unlocked.
StatusOr<int> OpenLockedRegularFile(const std::string& path, bool create, bool replace_any_file) {
  StatusOr<int> fd =
      OpenOutputFile(path, TraceOutput(replace_any_file), create, /*truncate=*/false);
  if (!fd.ok()) return fd;
  if (::flock(fd.value(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd.value());
    return Status(StatusCode::kIoError, path + ": another recording is writing it");
  }
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
  TORCHRR_RETURN_IF_ERROR(CheckOutputFile(path, TraceOutput(replace_any_file)));
  // An existing trace: also free of another recording's lock.
  struct stat st;
  if (path.empty() || ::lstat(path.c_str(), &st) != 0) return Status::Ok();
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
  TORCHRR_RETURN_IF_ERROR(WriteAll(fd_, data, size, path_));
  offset_ += size;
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
