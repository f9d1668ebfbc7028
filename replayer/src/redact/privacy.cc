#include "torchrr/replayer/privacy.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <variant>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "torchrr/format/record_fields.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {
namespace {

constexpr size_t kPathExamples = 3;

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool IsAlnum(char c) { return IsWordChar(c) && c != '_'; }

// Where a name may be replaced.
enum class Boundary {
  kAnywhere,       // --map: wherever the user's OLD occurs.
  kWord,           // No letter or digit on either side: a host or user name in text.
  kComponent,      // A whole path component: a host or user name in a path.
  kPathComponent,  // Followed by "/" or the end: a home directory.
};

// `text` with every occurrence of `from` that `boundary` allows replaced by `to`.
std::string ReplaceAll(const std::string& text, const std::string& from, const std::string& to,
                       Boundary boundary) {
  if (from.empty()) return text;
  std::string out;
  size_t done = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1)) {
    if (at < done) continue;
    size_t end = at + from.size();
    bool word_before = at > 0 && IsAlnum(text[at - 1]);
    bool word_after = end < text.size() && IsAlnum(text[end]);
    if (boundary == Boundary::kWord && (word_before || word_after)) continue;
    if (boundary == Boundary::kComponent &&
        ((at > 0 && text[at - 1] != '/') || (end < text.size() && text[end] != '/'))) {
      continue;
    }
    if (boundary == Boundary::kPathComponent && end < text.size() && text[end] != '/') continue;
    out.append(text, done, at - done);
    out += to;
    done = end;
  }
  out.append(text, done, std::string::npos);
  return out;
}

// Calls fn(text) for every string of `record`, in nested structs and vectors too (the field lists
// of record_fields.h), so that a string field added to a record later is seen (and redacted)
// without a change here. `record` may be const.
template <class R, class Fn>
void ForEachString(R& record, Fn&& fn) {
  format::ForEachLeafField(record, [&](const auto&, auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::string>) {
      fn(value);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      for (auto& text : value) fn(text);
    }
  });
}

// The user name of a home directory ("/home/alice" → "alice", "/root" → "root").
std::string UserOfHome(const std::string& home) { return home.substr(home.rfind('/') + 1); }

void SortLongestFirst(std::vector<std::string>& names) {
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::erase(names, "");
}

}  // namespace

std::vector<std::string> HomeDirectories(const std::string& text) {
  std::vector<std::string> homes;
  auto add = [&](std::string home) {
    if (std::find(homes.begin(), homes.end(), home) == homes.end()) homes.push_back(home);
  };
  for (const char* prefix : {"/home/", "/Users/"}) {
    const size_t n = std::char_traits<char>::length(prefix);
    for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
      size_t end = text.find('/', at + n);
      if (end == std::string::npos) end = text.size();
      if (end > at + n) add(text.substr(at, end - at));
    }
  }
  for (size_t at = text.find("/root"); at != std::string::npos; at = text.find("/root", at + 1)) {
    size_t end = at + 5;
    if ((at == 0 || !IsWordChar(text[at - 1])) && (end == text.size() || text[end] == '/')) {
      add("/root");
    }
  }
  return homes;
}

void PrivacyScan::SeeString(const std::string& text) {
  for (const std::string& home : HomeDirectories(text)) {
    homes_.insert(home);
    users_.insert(UserOfHome(home));
  }
  if (!text.empty() && text.front() == '/') {
    ++absolute_paths_;
    if (path_examples_.size() < kPathExamples) path_examples_.push_back(text);
  }
}

void PrivacyScan::SeeInfo(const format::FileInfo& info) {
  host_ = info.host;
  command_line_ = info.command_line;
  ForEachString(info, [&](const std::string& text) { SeeString(text); });
}

void PrivacyScan::See(const format::Record& record) {
  ForEachString(record, [&](const std::string& text) { SeeString(text); });
  if (const auto* op = std::get_if<format::OpRecord>(&record)) {
    values_ += op->values.size();
    for (const format::Value& v : op->values)
      string_values_ += v.kind == format::ValueKind::kString;
  } else if (std::holds_alternative<format::ErrorRecord>(record)) {
    ++error_messages_;
  } else if (const auto* file = std::get_if<format::SourceFile>(&record)) {
    source_files_.insert(file->file);
  } else if (const auto* lines = std::get_if<format::SourceLines>(&record)) {
    source_files_.insert(lines->file);
    source_lines_ += lines->text.size();
    for (const std::string& line : lines->text) source_bytes_ += line.size() + 1;
  }
}

std::vector<std::string> PrivacyScan::Lines() const {
  auto list = [](const std::set<std::string>& names) {
    std::string out;
    for (const std::string& name : names)
      out += (out.empty() ? "" : ", ") + replayer::Printable(name);
    return out.empty() ? std::string("none seen") : out;
  };
  std::vector<std::string> lines;
  lines.push_back("  host name:        " +
                  (host_.empty() ? "not recorded" : replayer::Printable(host_)));
  lines.push_back("  user names:       " + list(users_) + " (from home directories in paths)");
  lines.push_back("  home directories: " + list(homes_));
  lines.push_back(fmt::format("  command line:     {} arguments", command_line_.size()));
  lines.push_back("  working dir:      not recorded");
  lines.push_back("  environment:      not recorded");
  std::string examples;
  for (const std::string& path : path_examples_) examples += "\n    " + replayer::Printable(path);
  lines.push_back(
      fmt::format("  absolute paths:   {} (source files, libraries){}", absolute_paths_, examples));
  lines.push_back(
      fmt::format("  argument values:  {} recorded ({} strings)", values_, string_values_));
  lines.push_back(fmt::format("  error messages:   {}", error_messages_));
  lines.push_back(source_lines_ == 0
                      ? std::string("  source code:      none")
                      : fmt::format("  source code:      {} lines of {} file{} ({} bytes)",
                                    source_lines_, source_files_.size(),
                                    source_files_.size() == 1 ? "" : "s", source_bytes_));
  lines.push_back("  torchrr redact FILE -o OUT rewrites these (see torchrr redact --help)");
  return lines;
}

nlohmann::json PrivacyScan::ToJson() const {
  return {{"host", host_},
          {"user_names", users_},
          {"home_directories", homes_},
          {"command_line_arguments", command_line_.size()},
          {"working_directory_recorded", false},
          {"environment_recorded", false},
          {"absolute_paths", absolute_paths_},
          {"absolute_path_examples", path_examples_},
          {"argument_values", values_},
          {"string_argument_values", string_values_},
          {"error_messages", error_messages_},
          {"source_files", source_files_.size()},
          {"source_lines", source_lines_},
          {"source_bytes", source_bytes_}};
}

void Redaction::AddThisMachine() {
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr) {
    if (pw->pw_name != nullptr) users.emplace_back(pw->pw_name);
    if (pw->pw_dir != nullptr && std::string_view(pw->pw_dir).size() > 1)
      homes.emplace_back(pw->pw_dir);
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && std::string_view(home).size() > 1) homes.emplace_back(home);
}

void Redaction::Finish() {
  for (std::string& home : homes) {
    while (home.size() > 1 && home.back() == '/') home.pop_back();
  }
  SortLongestFirst(homes);
  SortLongestFirst(hosts);
  SortLongestFirst(users);
}

std::string Redaction::Apply(const std::string& text, bool* changed, Role role) const {
  std::string out = text;
  for (const auto& [from, to] : maps) out = ReplaceAll(out, from, to, Boundary::kAnywhere);
  // "/home/al" must not turn "/home/alice" into "~ice".
  for (const std::string& home : homes) out = ReplaceAll(out, home, "~", Boundary::kPathComponent);
  if (role != Role::kName) {
    const Boundary boundary = role == Role::kPath ? Boundary::kComponent : Boundary::kWord;
    for (const std::string& host : hosts) out = ReplaceAll(out, host, "<host>", boundary);
    for (const std::string& user : users) out = ReplaceAll(out, user, "<user>", boundary);
  }
  if (changed != nullptr) *changed = out != text;
  return out;
}

void Redaction::Rewrite(std::string& text, int* changed, Role role) const {
  bool one = false;
  text = Apply(text, &one, role);
  *changed += one;
}

int Redaction::ApplyTo(format::FileInfo& info) const {
  int changed = 0;
  if (drop_args && info.command_line.size() > 1) {
    info.command_line.resize(1);
    ++changed;
  }
  ForEachString(info, [&](std::string& text) { Rewrite(text, &changed); });
  return changed;
}

bool Redaction::Drops(const format::Record& record) const {
  return drop_source && (std::holds_alternative<format::SourceFile>(record) ||
                         std::holds_alternative<format::SourceLines>(record));
}

int Redaction::ApplyTo(format::Record& record) const {
  int changed = 0;
  if (auto* s = std::get_if<format::StringDef>(&record);
      s != nullptr && drop_values && value_strings_.contains(s->id) &&
      !named_strings_.contains(s->id)) {
    changed += !s->text.empty();
    s->text.clear();  // Kept, empty: ids stay defined.
    return changed;
  }
  if (auto* op = std::get_if<format::OpRecord>(&record); op != nullptr && drop_values) {
    changed += !op->values.empty();
    op->values.clear();
  }
  if (auto* s = std::get_if<format::StringDef>(&record)) {
    const Role role = name_strings_.contains(s->id)   ? Role::kName
                      : path_strings_.contains(s->id) ? Role::kPath
                                                      : Role::kText;
    Rewrite(s->text, &changed, role);
    return changed;
  }
  ForEachString(record, [&](std::string& text) { Rewrite(text, &changed); });
  return changed;
}

void Redaction::FindNames(const format::FileInfo& info) {
  if (!info.host.empty()) {
    hosts.push_back(info.host);
    // "node7.cluster.example.com" also appears as "node7".
    if (size_t dot = info.host.find('.'); dot != std::string::npos && dot > 0) {
      hosts.push_back(info.host.substr(0, dot));
    }
  }
  ForEachString(info, [&](const std::string& text) { FindHomes(text); });
  command_line_args_ = info.command_line.empty() ? 0 : info.command_line.size() - 1;
}

void Redaction::FindHomes(const std::string& text) {
  for (const std::string& home : HomeDirectories(text)) {
    homes.push_back(home);
    users.push_back(UserOfHome(home));
  }
}

void Redaction::FindNames(const format::Record& record) {
  ForEachString(record, [&](const std::string& text) { FindHomes(text); });
  if (const auto* error = std::get_if<format::ErrorRecord>(&record)) {
    named_strings_.insert(error->type);
    name_strings_.insert(error->type);
    error_messages_ += !error->message.empty();
  } else if (const auto* op = std::get_if<format::OpRecord>(&record)) {
    named_strings_.insert({op->name, op->overload});
    name_strings_.insert({op->name, op->overload});
    for (const format::Value& v : op->values) value_strings_.insert(v.s);
  } else if (const auto* frame = std::get_if<format::FrameDef>(&record)) {
    named_strings_.insert({frame->function, frame->file, frame->library});
    path_strings_.insert({frame->file, frame->library});
  } else if (const auto* node = std::get_if<format::NodeRecord>(&record)) {
    named_strings_.insert(node->name);
    name_strings_.insert(node->name);
    for (const format::SavedTensor& saved : node->saved) {
      named_strings_.insert(saved.name);
      name_strings_.insert(saved.name);
    }
  } else if (const auto* kernel = std::get_if<format::CudaKernelRecord>(&record)) {
    named_strings_.insert(kernel->name);
    name_strings_.insert(kernel->name);
  } else if (const auto* print = std::get_if<format::FingerprintRecord>(&record)) {
    named_strings_.insert(print->saved_name);
    name_strings_.insert(print->saved_name);
  }
}

std::string Redaction::Describe() const {
  std::vector<std::string> parts;
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& name : names)
      out += (out.empty() ? "" : ", ") + replayer::Printable(name);
    return out;
  };
  for (const auto& [from, to] : maps) {
    parts.push_back(replayer::Printable(from) + " -> " + replayer::Printable(to));
  }
  if (!homes.empty()) parts.push_back("home directories " + list(homes) + " -> ~");
  if (!hosts.empty()) parts.push_back("host " + list(hosts) + " -> <host>");
  if (!users.empty()) parts.push_back("user " + list(users) + " -> <user>");
  if (drop_values) parts.push_back("argument values dropped");
  if (drop_source) parts.push_back("source code dropped");
  if (drop_args && command_line_args_ > 0) parts.push_back("command-line arguments dropped");
  // What stays as it was, unless a rule above matched inside it.
  std::vector<std::string> kept;
  if (!drop_args && command_line_args_ > 0) {
    kept.push_back(fmt::format("{} command-line argument{} (--drop-args drops them)",
                               command_line_args_, command_line_args_ == 1 ? "" : "s"));
  }
  if (error_messages_ > 0) {
    kept.push_back(fmt::format("{} error message{} (the replay reads them; --map rewrites a "
                               "secret in them)",
                               error_messages_, error_messages_ == 1 ? "" : "s"));
  }
  if (!kept.empty()) parts.push_back("kept: " + fmt::format("{}", fmt::join(kept, ", ")));
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : "; ") + part;
  return out;
}

}  // namespace torchrr::replayer
