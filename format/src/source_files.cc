#include "torchrr/format/source_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string_view>

#include <xxhash.h>

#ifdef __linux__
#include <linux/magic.h>
#include <sys/vfs.h>
#endif

namespace torchrr::format {
namespace {

// Directories of kernel and device files, never sources.
bool UnderSystemDirectory(std::string_view resolved) {
  for (std::string_view dir : {"/proc", "/sys", "/dev"}) {
    if (resolved.starts_with(dir) &&
        (resolved.size() == dir.size() || resolved[dir.size()] == '/')) {
      return true;
    }
  }
  return false;
}

// Whether the open file lives on a kernel file system (mounted anywhere: a container's /proc may
// be bound elsewhere). Not known off Linux: false.
bool OnKernelFileSystem([[maybe_unused]] int fd) {
#ifdef __linux__
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return true;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
      return true;
    default:
      return false;
  }
#else
  return false;
#endif
}

bool RegularAndSmall(const struct stat& st, size_t max_bytes) {
  return S_ISREG(st.st_mode) && st.st_size >= 0 && static_cast<size_t>(st.st_size) <= max_bytes;
}

}  // namespace

std::optional<std::string> ReadSourceFile(const std::string& path, size_t max_bytes) {
  if (path.empty() || path.find('\0') != std::string::npos) return std::nullopt;
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr || UnderSystemDirectory(resolved)) {
    return std::nullopt;
  }
  struct stat st {};
  if (stat(resolved, &st) != 0 || !RegularAndSmall(st, max_bytes)) return std::nullopt;
  int fd = open(resolved, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> text;
  if (fstat(fd, &st) == 0 && RegularAndSmall(st, max_bytes) && !OnKernelFileSystem(fd)) {
    // Read to the end, one byte past the limit at most: the file may have grown since fstat.
    std::string bytes(static_cast<size_t>(st.st_size) + 1, '\0');
    size_t got = 0;
    while (true) {
      if (got == bytes.size()) {
        if (bytes.size() > max_bytes) break;
        bytes.resize(std::min(bytes.size() * 2, max_bytes + 1));
      }
      ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) text = bytes.substr(0, got);
        break;
      }
      got += static_cast<size_t>(n);
    }
    if (got > max_bytes) text.reset();
  }
  close(fd);
  return text;
}

uint64_t SourceHash(std::string_view bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

std::vector<std::string_view> SplitSourceLines(std::string_view bytes) {
  std::vector<std::string_view> lines;
  while (!bytes.empty()) {
    size_t end = bytes.find('\n');
    std::string_view one = bytes.substr(0, end);
    if (one.ends_with('\r')) one.remove_suffix(1);
    lines.push_back(one);
    bytes = end == std::string_view::npos ? std::string_view() : bytes.substr(end + 1);
  }
  return lines;
}

}  // namespace torchrr::format
