#include "source_files.h"

#include <climits>
#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

#include "torchrr/format/source_files.h"

namespace torchrr::replayer {

namespace {

std::vector<std::string>& Roots() {
  static std::vector<std::string> roots;
  return roots;
}

std::string Resolved(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : std::string();
}

bool HasSourceExtension(std::string_view path) {
  static constexpr std::array<std::string_view, 18> kExtensions = {
      ".py", ".pyi", ".pyx", ".pxd", ".pxi", ".c", ".cc", ".cpp", ".cxx",
      ".c++", ".h", ".hh", ".hpp", ".hxx", ".inl", ".ipp", ".cu", ".cuh"};
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash)) {
    return false;
  }
  const std::string_view extension = path.substr(dot);
  return std::find(kExtensions.begin(), kExtensions.end(), extension) != kExtensions.end();
}

}  // namespace

void SetLocalSourceRoots(std::vector<std::string> roots) { Roots() = std::move(roots); }

bool IsLocalSource(const std::string& path) {
  const std::string file = Resolved(path);
  if (file.empty() || !HasSourceExtension(file)) return false;
  std::vector<std::string> roots = Roots();
  if (roots.empty()) {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) return false;
    roots.emplace_back(cwd);
  }
  for (const std::string& root : roots) {
    std::string dir = Resolved(root);
    if (dir.empty()) continue;
    if (dir.back() != '/') dir += '/';
    if (file.starts_with(dir)) return true;
  }
  return false;
}

SourceCache::LocalFile& SourceCache::Local(const std::string& path, bool recorded) {
  LocalFile& file = files_[path];
  if (file.read) return file;
  file.read = true;
  if (!recorded && !IsLocalSource(path)) {
    file.refused = true;
    return file;
  }
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
  const LocalFile& local = Local(path, recorded != nullptr);
  const bool local_differs = recorded != nullptr && local.hash && *local.hash != recorded->hash;
  if (recorded != nullptr) {
    auto it = recorded->text.find(line);
    if (it != recorded->text.end()) {
      from = local_differs ? SourceOrigin::kTraceDiffers : SourceOrigin::kTrace;
      return &it->second;
    }
    if (local_differs) return nullptr;  // Never a line of another version of the file.
  }
  if (local.refused) {
    from = SourceOrigin::kNotLocalSource;
    return nullptr;
  }
  if (line > local.lines.size()) return nullptr;
  from = recorded != nullptr ? SourceOrigin::kTrace : SourceOrigin::kLocal;
  return &local.lines[line - 1];
}

}  // namespace torchrr::replayer
