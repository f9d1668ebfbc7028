// SourceCache: the lines a report quotes, from the trace when it recorded them (format 1.4), else
// from the file of the same path on this machine, read safely (torchrr/format/source_files.h).
//
// A recorded file is the one the run executed: its lines are quoted even where this machine has
// another file at that path, which the cache then reports as differing (another hash). A line the
// trace did not record is read from this machine's file only when that file is the recorded one
// (same hash), so a quote never mixes two versions of a file.
#ifndef TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_
#define TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// 256 MiB: what one report reads from this machine at most, over all the files it quotes.
inline constexpr size_t kMaxSourceBytesPerReport = 256u << 20;

// Where a quoted line came from.
enum class SourceOrigin : uint8_t {
  kNone,      // Neither recorded nor readable here.
  kTrace,     // Recorded; this machine has no readable file at that path, or the same one.
  kTraceDiffers,  // Recorded; this machine's file at that path is another (another hash).
  kLocal,     // Not recorded (an older trace, --no-source): this machine's file.
  kNotLocalSource,  // Not recorded, and this machine's file is no source file under the roots.
};

// Whether the reports may read this machine's file at `path` for code the trace does not carry
// (SetLocalSourceRoots): a source file by its extension, under a root after realpath.
bool IsLocalSource(const std::string& path);

// Not thread-safe; one per report.
class SourceCache {
 public:
  // `recorded`: the trace's (Report::sources); may be null. Must outlive the cache.
  explicit SourceCache(const std::map<std::string, RecordedSource>* recorded = nullptr)
      : recorded_(recorded) {}

  // The line (1-based, without its line break), or nullptr when neither the trace nor this
  // machine has it. `origin`, when given, says where it came from.
  const std::string* Line(const std::string& path, uint32_t line, SourceOrigin* origin = nullptr);

 private:
  struct LocalFile {
    bool read = false;
    bool refused = false;  // Not recorded, and not a local source (IsLocalSource).
    std::optional<uint64_t> hash;       // Of the bytes read; unset: not readable here.
    std::vector<std::string> lines;
  };
  // `recorded`: whether the trace carries the file (then it is read to compare, wherever it is).
  LocalFile& Local(const std::string& path, bool recorded);

  const std::map<std::string, RecordedSource>* recorded_;
  std::map<std::string, LocalFile> files_;
  size_t bytes_read_ = 0;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_SOURCE_FILES_H_
