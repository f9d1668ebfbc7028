// `torchrr dump FILE`: every record, one line each, as text (interned names resolved) or JSON.
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>

#include "commands.h"
#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {
namespace {

struct DumpOptions {
  std::string path;
  bool json = false;
};

// Fields that hold a StringDef id, by name in the JSON of records.h.
bool IsStringField(const std::string& kind, const std::string& field) {
  if (field == "name" || field == "overload" || field == "function" || field == "file" ||
      field == "library" || field == "saved_name") {
    return kind != "saved";
  }
  return field == "type" && kind == "error";
}

// One line per record: its kind, then field=value, StringDef ids resolved to their text. Every
// string is quoted and escaped (replayer::Printable), so that a record stays one line whatever
// its strings hold.
class TextDumper {
 public:
  void Print(const format::Record& record) {
    if (const auto* def = std::get_if<format::StringDef>(&record)) {
      strings_[def->id] = replayer::Shortened(def->text);
    }
    nlohmann::ordered_json j = format::RecordToJson(record);
    line_.clear();
    const std::string kind = j["kind"].get<std::string>();
    line_ += kind;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "kind") continue;
      line_ += ' ';
      line_ += it.key();
      line_ += '=';
      Append(kind, it.key(), it.value());
    }
    line_ += '\n';
    std::fwrite(line_.data(), 1, line_.size(), stdout);
  }

 private:
  // Appends `value`: a StringDef id as its text and any string quoted, both escaped; an array
  // element by element ([1,2], [{a=1 b=2}, {a=3 b=4}]); anything else as its JSON.
  void Append(const std::string& kind, const std::string& field,
              const nlohmann::ordered_json& value) {
    if (IsStringField(kind, field) && value.is_number_unsigned()) {
      auto id = value.get<format::InternId>();
      auto it = strings_.find(id);
      if (id != 0 && it != strings_.end()) {
        AppendString(it->second);
        return;
      }
    }
    if (value.is_string()) {
      AppendString(value.get_ref<const std::string&>());
      return;
    }
    if (value.is_array() && !value.empty() && value.front().is_object()) {
      // Tensor uses, edges, saved tensors, values: resolve names inside them too.
      line_ += '[';
      bool first = true;
      for (const nlohmann::ordered_json& element : value) {
        if (!first) line_ += ", ";
        first = false;
        line_ += '{';
        bool first_field = true;
        for (auto it = element.begin(); it != element.end(); ++it) {
          if (!first_field) line_ += ' ';
          first_field = false;
          line_ += it.key();
          line_ += '=';
          Append(field == "saved" ? "saved_tensor" : "element", it.key(), it.value());
        }
        line_ += '}';
      }
      line_ += ']';
      return;
    }
    if (value.is_array()) {
      line_ += '[';
      for (size_t i = 0; i < value.size(); ++i) {
        if (i > 0) line_ += ',';
        Append(kind, field, value[i]);
      }
      line_ += ']';
      return;
    }
    line_ += value.dump();  // A number, a boolean or null.
  }

  // "text", escaped.
  void AppendString(const std::string& text) {
    line_ += '"';
    line_ += replayer::Printable(text, '"');
    line_ += '"';
  }

  std::unordered_map<format::InternId, std::string> strings_;
  std::string line_;
};

int RunDump(const DumpOptions& options) {
  format::ReadSummary summary;
  if (options.json) {
    // The first line describes the whole file, so a first pass reads the summary; the second
    // prints the records as they come (memory stays bounded by one chunk).
    summary = format::ReadTraceFile(options.path, nullptr);
    int rc = ReportRead(options.path, summary);
    if (NothingRead(rc)) return rc;
    std::printf("%s\n", JsonText(format::SummaryToJson(summary)).c_str());
    (void)format::ReadTraceFile(options.path, [](const format::Record& record) {
      std::string line = JsonText(format::RecordToJson(record));
      line += '\n';
      std::fwrite(line.data(), 1, line.size(), stdout);
    });
    std::fflush(stdout);
    return rc;
  }
  TextDumper dumper;
  summary = format::ReadTraceFile(options.path,
                                  [&](const format::Record& record) { dumper.Print(record); });
  std::fflush(stdout);
  return ReportRead(options.path, summary);
}

}  // namespace

void RegisterDumpCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<DumpOptions>();
  CLI::App* dump = app.add_subcommand("dump", "Print every record of a trace, one per line");
  AddTraceArgument(*dump, &options->path);
  dump->footer(ExitCodesFooter({kExitOk, kExitUsage, kExitNotATrace, kExitTruncated,
                                kExitCorrupt, kExitTooNew, kExitOther, kExitMemory}));
  dump->add_flag("--json", options->json,
                 "One JSON object per line; the first describes the file (kind \"trace\")");
  dump->callback([options, exit_code] { *exit_code = RunDump(*options); });
}

}  // namespace torchrr::cli
