#include "source_files.h"

#include <algorithm>
#include <string_view>

#include "torchrr/format/source_files.h"

namespace torchrr::replayer {

SourceCache::LocalFile& SourceCache::Local(const std::string& path) {
  LocalFile& file = files_[path];
  if (file.read) return file;
  file.read = true;
  if (bytes_read_ >= kMaxSourceBytesPerReport) return file;
  std::optional<std::string> text = format::ReadSourceFile(
      path, std::min(format::kMaxSourceBytes, kMaxSourceBytesPerReport - bytes_read_));
  if (!text) return file;
  bytes_read_ += text->size();
  file.hash = format::SourceHash(*text);
  for (std::string_view line : format::SplitSourceLines(*text)) file.lines.emplace_back(line);
  return file;
}

const std::string* SourceCache::Line(const std::string& path, uint32_t line,
                                     SourceOrigin* origin) {
  SourceOrigin unused;
  SourceOrigin& from = origin != nullptr ? *origin : unused;
  from = SourceOrigin::kNone;
  if (path.empty() || line == 0) return nullptr;
  const RecordedSource* recorded = nullptr;
  if (recorded_ != nullptr) {
    auto it = recorded_->find(path);
    if (it != recorded_->end()) recorded = &it->second;
  }
  const LocalFile& local = Local(path);
  const bool local_differs = recorded != nullptr && local.hash && *local.hash != recorded->hash;
  if (recorded != nullptr) {
    auto it = recorded->text.find(line);
    if (it != recorded->text.end()) {
      from = local_differs ? SourceOrigin::kTraceDiffers : SourceOrigin::kTrace;
      return &it->second;
    }
    if (local_differs) return nullptr;  // Never a line of another version of the file.
  }
  if (line > local.lines.size()) return nullptr;
  from = recorded != nullptr ? SourceOrigin::kTrace : SourceOrigin::kLocal;
  return &local.lines[line - 1];
}

}  // namespace torchrr::replayer
