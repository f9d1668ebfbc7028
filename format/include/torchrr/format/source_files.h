// Source files: reading one safely, its hash and its lines. The recorder copies the lines that
// user frames name into the trace (SourceFile, SourceLines: format 1.4); the replayer quotes them,
// and compares the file of the same path on its own machine against the recorded hash.
//
// A path may come from a stranger's trace, or from a frame of a program that names anything: a
// read must never return a file that is no source (/proc/self/environ, a device), hang on one (a
// FIFO, a terminal) or run out of memory on one (/dev/zero). So a file is read only when it is a
// regular file of at most `max_bytes`, not under /proc, /sys or /dev and not on a kernel file
// system (procfs, sysfs and the like, wherever mounted): its path is resolved (realpath) and
// stat'ed, the file opened with O_NONBLOCK | O_NOFOLLOW | O_NOCTTY, and the open descriptor
// checked again (fstat, fstatfs) before a byte is read.
#ifndef TORCHRR_FORMAT_SOURCE_FILES_H_
#define TORCHRR_FORMAT_SOURCE_FILES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchrr::format {

// 8 MiB: larger than any source file worth quoting.
inline constexpr size_t kMaxSourceBytes = 8u << 20;

// The bytes of the file at `path` when it may be read (the comment above says when), else nullopt:
// unsafe, missing, unreadable, or larger than `max_bytes`. Thread-safe.
std::optional<std::string> ReadSourceFile(const std::string& path, size_t max_bytes);

// SourceFile.hash of a file's bytes: XXH64 with seed 0, as `xxhsum -H64` prints it.
uint64_t SourceHash(std::string_view bytes);

// The lines of a file's bytes, without their line breaks ("\n" or "\r\n"); a last line without a
// break counts, an empty file has none. The views point into `bytes`.
std::vector<std::string_view> SplitSourceLines(std::string_view bytes);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_SOURCE_FILES_H_
