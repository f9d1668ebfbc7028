// SourceCache: the lines of the source files a trace's stacks name, read from this machine for the
// text report's quotes.
//
// A trace may come from a stranger, and its stacks can name any path: a quote must never print a
// file that is no source (/proc/self/environ, a device), hang on one (a FIFO, a terminal) or run
// out of memory on one (/dev/zero). So a file is read only when it is a regular file of at most
// kMaxSourceBytes, not under /proc, /sys or /dev and not on a kernel file system (procfs, sysfs
// and the like, wherever mounted): its path is resolved (realpath) and stat'ed, the file opened
// with O_NONBLOCK | O_NOFOLLOW | O_NOCTTY, and the open descriptor checked again (fstat, fstatfs)
// before a byte is read. What it does read is the user's own machine's: a regular file the
// replaying user can read.
#ifndef TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_
#define TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torchrr::replayer {

// 8 MiB: larger than any source file worth quoting.
inline constexpr size_t kMaxSourceBytes = 8u << 20;
// 256 MiB: what one report reads at most, over all the files it quotes.
inline constexpr size_t kMaxSourceBytesPerReport = 256u << 20;

// The bytes of the file at `path` when it may be read (the class comment says when), else
// nullopt: unsafe, missing, unreadable, or larger than `max_bytes`. Thread-safe.
std::optional<std::string> ReadSourceFile(const std::string& path, size_t max_bytes);

// Source files read once each, for one report. Not thread-safe.
class SourceCache {
 public:
  // The line (1-based, without its line break), or nullptr when the file may not be read, or has
  // no such line.
  const std::string* Line(const std::string& path, uint32_t line);

 private:
  std::map<std::string, std::vector<std::string>> files_;  // Empty: not read.
  size_t bytes_read_ = 0;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_
