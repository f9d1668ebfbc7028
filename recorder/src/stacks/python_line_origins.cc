// Where torch.fx generated code came from, and the frames of a traceback: text only, no Python.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stacks/python_stacks.h"

namespace torchrr::recorder {

std::vector<PythonLineOrigin> GeneratedLineOrigins(std::string_view source) {
  std::vector<PythonLineOrigin> origins;
  std::optional<PythonLineOrigin> current;
  int32_t number = 0;
  while (!source.empty()) {
    size_t end = source.find('\n');
    std::string_view line = source.substr(0, end);
    source = end == std::string_view::npos ? std::string_view() : source.substr(end + 1);
    ++number;
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) continue;
    line.remove_prefix(first);
    if (!line.starts_with('#')) {
      if (current) {
        origins.push_back(*current);
        origins.back().line = number;
      }
      continue;
    }
    if (line.find("No stacktrace found") != std::string_view::npos) {
      current.reset();
      continue;
    }
    size_t at = line.find("File: ");
    if (at == std::string_view::npos) continue;  // Another annotation: the origin holds.
    // "path:68 in forward, code: ...": the code is cut off first (it may hold anything), then the
    // last ":<digits> in " ends the path (which may hold ':' and " in " itself; a function name
    // holds neither).
    std::string_view rest = line.substr(at + 6);
    rest = rest.substr(0, rest.find(", code: "));
    for (size_t in = rest.rfind(" in "); in != std::string_view::npos && in > 0;
         in = rest.rfind(" in ", in - 1)) {
      size_t digits = in;
      while (digits > 0 && rest[digits - 1] >= '0' && rest[digits - 1] <= '9') --digits;
      if (digits == in || digits < 2 || rest[digits - 1] != ':') continue;
      PythonLineOrigin origin;
      origin.file = std::string(rest.substr(0, digits - 1));
      int64_t value = 0;
      for (size_t i = digits; i < in && value < INT32_MAX; ++i) value = value * 10 + (rest[i] - '0');
      origin.origin_line = static_cast<int32_t>(std::min<int64_t>(value, INT32_MAX));
      std::string_view function = rest.substr(in + 4);
      origin.function = std::string(function.substr(0, function.find_last_not_of(" \r") + 1));
      current = std::move(origin);
      break;
    }
  }
  return origins;
}

const PythonLineOrigin* OriginOfLine(const std::vector<PythonLineOrigin>& origins, int32_t line) {
  auto it = std::lower_bound(origins.begin(), origins.end(), line,
                             [](const PythonLineOrigin& o, int32_t l) { return o.line < l; });
  return it != origins.end() && it->line == line ? &*it : nullptr;
}

std::vector<PythonLineOrigin> TracebackFrames(std::string_view stack_trace) {
  std::vector<PythonLineOrigin> frames;
  constexpr std::string_view kFile = "File \"";
  constexpr std::string_view kLine = "\", line ";
  constexpr std::string_view kIn = ", in ";
  for (size_t at = stack_trace.find(kFile); at != std::string_view::npos;
       at = stack_trace.find(kFile, at + 1)) {
    size_t start = at + kFile.size();
    size_t end_of_line = stack_trace.find('\n', start);
    std::string_view line = stack_trace.substr(start, end_of_line - start);
    size_t quote = line.rfind(kLine);  // A path may hold `", line ` only pathologically.
    if (quote == std::string_view::npos) continue;
    std::string_view rest = line.substr(quote + kLine.size());
    size_t digits = 0;
    int64_t value = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
      if (value < INT32_MAX) value = value * 10 + (rest[digits] - '0');
      ++digits;
    }
    if (digits == 0 || !rest.substr(digits).starts_with(kIn)) continue;
    PythonLineOrigin frame;
    frame.file = std::string(line.substr(0, quote));
    frame.origin_line = static_cast<int32_t>(std::min<int64_t>(value, INT32_MAX));
    std::string_view function = rest.substr(digits + kIn.size());
    frame.function = std::string(function.substr(0, function.find_last_not_of(" \r") + 1));
    frames.push_back(std::move(frame));
  }
  return frames;
}

}  // namespace torchrr::recorder
