// The source lines around each user frame, read by the writer thread when a frame is first
// written (RecorderOptions::source).
#include "sink/trace_sink.h"

#include <algorithm>
#include <string>

#include "torchrr/format/source_files.h"

namespace torchrr::recorder {

namespace {

// Source context: the lines before and after a frame's line that the trace carries.
constexpr uint32_t kSourceContextLines = 3;
// Bounds on what source costs: the files read (kept for the run: each frame's lines are cut from
// them when first seen), the lines written, and the longest line written (a minified or generated
// file's). A line past them is not written: the replay reads it from its own machine's file, when
// that is the same file.
constexpr size_t kMaxSourceBytesRead = 64u << 20;
constexpr size_t kMaxSourceBytesWritten = 16u << 20;
constexpr size_t kMaxSourceLineBytes = 16u << 10;

}  // namespace

bool TraceSink::WriteSource(format::InternId file, const std::string& path, uint32_t line) {
  if (!options_.source || file == 0 || line == 0 || path.empty()) return true;
  auto [it, first_seen] = sources_.try_emplace(path);
  Source& source = it->second;
  if (first_seen) {
    if (path.front() == '<' || source_bytes_read_ >= kMaxSourceBytesRead) return true;
    std::optional<std::string> bytes = format::ReadSourceFile(
        path, std::min(format::kMaxSourceBytes, kMaxSourceBytesRead - source_bytes_read_));
    if (!bytes) return true;  // "<stdin>", a file gone or unreadable: the trace has no code.
    source_bytes_read_ += bytes->size();
    source.readable = true;
    source.file = file;
    source.bytes = std::move(*bytes);
    source.lines = format::SplitSourceLines(source.bytes);
    source.written.assign(source.lines.size(), false);
    format::SourceFile def;
    def.file = file;
    def.hash = format::SourceHash(source.bytes);
    def.bytes = source.bytes.size();
    def.lines = static_cast<uint32_t>(source.lines.size());
    if (!Emit(format::Record(def))) return false;
  }
  if (!source.readable || line > source.lines.size()) return true;
  // The lines around `line` not yet written, in runs of consecutive ones.
  const uint32_t first = line > kSourceContextLines ? line - kSourceContextLines : 1;
  const uint32_t last = std::min<uint32_t>(line + kSourceContextLines,
                                           static_cast<uint32_t>(source.lines.size()));
  format::SourceLines run;
  run.file = source.file;
  auto flush = [&] {
    if (run.text.empty()) return true;
    bool ok = Emit(format::Record(run));
    run.text.clear();
    return ok;
  };
  for (uint32_t n = first; n <= last; ++n) {
    std::string_view text = source.lines[n - 1];
    const bool take = !source.written[n - 1] && text.size() <= kMaxSourceLineBytes &&
                      source_bytes_written_ + text.size() <= kMaxSourceBytesWritten;
    if (!take) {
      if (!flush()) return false;
      continue;
    }
    if (run.text.empty()) run.first_line = n;
    run.text.emplace_back(text);
    source.written[n - 1] = true;
    source_bytes_written_ += text.size();
  }
  return flush();
}

}  // namespace torchrr::recorder
