// `torchrr report FILE -o report.html`: the replay's verdicts as one self-contained HTML page
// (html_report.h) with the step's timeline and the autograd graph around each violation.
// `-o -` writes the page to stdout (a notebook shows it inline: torchrr.Report._repr_html_).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchrr/replayer/autograd_graph.h"
#include "commands.h"
#include "torchrr/replayer/graphviz.h"
#include "torchrr/replayer/html_report.h"
#include "torchrr/replayer/step_timeline.h"
#include "torchrr/format/output_file.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"
#include "torchrr/replayer/trace_tables.h"

namespace torchrr::cli {
namespace {

struct ReportOptions {
  std::string path;
  std::string output;
  std::string fix_json;  // --fix: `torchrr fix --json`'s document for the same trace.
  bool force = false;
  std::vector<std::string> source_roots;
};

// Graphs a page draws at most (each is a run of dot, up to its time limit).
constexpr size_t kMaxGraphs = 20;

// What makes two violations one site for the graphs: their kind, backward node, culprit and victim
// lines.
std::string SiteOf(const replayer::Violation& v) {
  auto line = [](const std::optional<replayer::OpRef>& op) {
    return op && op->user_frame ? op->user_frame->file + ":" + std::to_string(op->user_frame->line)
                                : std::string();
  };
  return fmt::format("{}\n{}\n{}\n{}", static_cast<int>(v.kind), v.backward_node.name,
                     line(v.culprit), line(v.victim));
}

// Writes `page` to stdout. Returns 0, or kExitOther when it could not be written whole.
int WriteToStdout(const std::string& page) {
  if (std::fwrite(page.data(), 1, page.size(), stdout) != page.size() || std::fflush(stdout) != 0) {
    std::fprintf(stderr, "torchrr: error: stdout: cannot write\n");
    return kExitOther;
  }
  return 0;
}

// The fix of each violation from `torchrr fix --json`'s document at `path` (its "edits", each
// naming the violations it fixes by their index), as diff text; empty when `path` is "". Returns
// false after one error line when the document cannot be read or is not fix's.
bool ReadFixes(const std::string& path, size_t violations, std::vector<std::string>* fixes) {
  if (path.empty()) return true;
  std::ifstream file(path, std::ios::binary);
  nlohmann::json document = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!file || !document.is_object() || !document.contains("edits") ||
      !document["edits"].is_array()) {
    std::fprintf(stderr, "torchrr: error: --fix %s: not the JSON of `torchrr fix --json`\n",
                 replayer::Printable(path).c_str());
    return false;
  }
  fixes->assign(violations, "");
  auto text = [](const nlohmann::json& edit, const char* key) {
    return edit.contains(key) && edit[key].is_string() ? edit[key].get<std::string>() : "";
  };
  auto prefixed = [](const std::string& lines, char prefix) {
    std::string out;
    for (size_t start = 0; start < lines.size();) {
      size_t end = lines.find('\n', start);
      if (end == std::string::npos) end = lines.size();
      out += prefix + lines.substr(start, end - start) + "\n";
      start = end + 1;
    }
    return out;
  };
  for (const nlohmann::json& edit : document["edits"]) {
    if (!edit.is_object() || !edit.contains("violations") || !edit["violations"].is_array()) continue;
    const int64_t first = edit.value("first_line", int64_t{0});
    std::string shown = fmt::format("--- a/{} (line {})\n", text(edit, "file"), first);
    if (edit.value("certain", false) && edit.contains("new") && edit["new"].is_string()) {
      shown += prefixed(text(edit, "old"), '-') + prefixed(text(edit, "new"), '+');
    } else {
      shown += "not certain: " + text(edit, "why") + "; choose:\n";
      if (edit.contains("choices") && edit["choices"].is_array()) {
        for (const nlohmann::json& choice : edit["choices"]) {
          if (choice.is_string()) shown += "  - " + choice.get<std::string>() + "\n";
        }
      }
    }
    for (const nlohmann::json& index : edit["violations"]) {
      if (index.is_number_unsigned() && index.get<uint64_t>() < violations) {
        (*fixes)[index.get<uint64_t>()] += shown;
      }
    }
  }
  return true;
}

int RunReport(const ReportOptions& options) {
  const bool to_stdout = options.output == kStdout;
  if (!to_stdout) {
    if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
  }
  replayer::SetLocalSourceRoots(options.source_roots);
  int refused = 0;
  if (!to_stdout &&
      CheckOutputFile(options.output, replayer::kHtmlReportPrefix, options.force, &refused) != 0) {
    return refused;
  }
  // Pass 1: the analysis, which says what the drawings mark.
  replayer::Analyzer analyzer;
  format::ReadSummary summary =
      format::ReadTraceFile(options.path, [&](const format::Record& r) { analyzer.Add(r); });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  const replayer::Report report = FinishAnalysis(analyzer, summary);

  replayer::HtmlReportParts parts;
  if (!ReadFixes(options.fix_json, report.violations.size(), &parts.fixes)) return kExitUsage;

  // Pass 2: the graph and the timeline, and the records the reproducers are sliced from (kept
  // only when there is a violation to reproduce).
  replayer::TraceTables tables;
  replayer::AutogradGraph graph;
  replayer::StepTimeline timeline(report);
  std::vector<format::Record> records;
  (void)format::ReadTraceFile(options.path, [&](const format::Record& r) {
    tables.See(r);
    graph.See(r);
    timeline.See(r, tables);
    if (!report.violations.empty()) records.push_back(r);
  });

  parts.trace_path = options.path;
  parts.summary = &summary;
  parts.report = &report;
  parts.timeline_svg = timeline.Svg();
  // One graph per distinct site (the same node, culprit and victim lines): a loop repeats its
  // violation each step, and each drawing is a run of dot. At most kMaxGraphs of them.
  std::map<std::string, size_t> drawn;  // Site -> the violation whose graph stands for it.
  // Site -> the violation whose reproducer stands for it (each is a slice of every record).
  std::map<std::string, size_t> reproduced;
  for (size_t i = 0; i < report.violations.size(); ++i) {
    const replayer::Violation& v = report.violations[i];
    parts.graph_svgs.emplace_back();
    parts.graph_notes.emplace_back();
    parts.repro_scripts.emplace_back();
    parts.repro_notes.emplace_back();
    const std::string site = SiteOf(v);
    if (auto same = reproduced.find(site); same != reproduced.end()) {
      parts.repro_notes[i] =
          fmt::format("the same site as violation {}: its reproducer is there", same->second + 1);
    } else if (reproduced.size() < kMaxGraphs) {
      replayer::ReproOptions repro_options;
      repro_options.violation = i;
      repro_options.trace_name = options.path;
      replayer::Repro repro = replayer::WriteRepro(records, report, summary.info, repro_options);
      parts.repro_scripts[i] = repro.ok ? std::move(repro.script) : "";
      parts.repro_notes[i] = repro.ok ? "" : repro.error;
      reproduced.emplace(site, i);
    } else {
      parts.repro_notes[i] =
          fmt::format("a page writes the reproducers of its first {} distinct sites", kMaxGraphs);
    }
    if (!parts.graph_problem.empty()) continue;
    if (auto same = drawn.find(site); same != drawn.end()) {
      parts.graph_notes[i] =
          fmt::format("the same site as violation {}: its graph is drawn there", same->second + 1);
      continue;
    }
    if (drawn.size() >= kMaxGraphs) {
      parts.graph_notes[i] =
          fmt::format("a page draws the graphs of its first {} distinct sites", kMaxGraphs);
      continue;
    }
    format::StatusOr<std::string> svg = replayer::DotToSvg(graph.Dot(v, tables));
    if (!svg.ok()) {
      parts.graph_problem = svg.status().message();
      std::fprintf(stderr, "torchrr: warning: no autograd graphs in the report: %s\n",
                   parts.graph_problem.c_str());
      continue;
    }
    parts.graph_svgs.back() = std::move(*svg);
    drawn.emplace(site, i);
  }

  const std::string page = replayer::HtmlReport(parts);
  const size_t n = report.violations.size();
  const std::string what = "the HTML page, " + std::to_string(n) + " violation" +
                           (n == 1 ? "" : "s") + "; open it in a browser";
  if (to_stdout) {
    const int written = WriteToStdout(page);
    if (written == 0) SayWrote(options.output, what);
    return written != 0 ? written : rc;
  }
  const int fd = OpenOutputFile(options.output, replayer::kHtmlReportPrefix, options.force, &refused);
  if (fd < 0) return refused;
  const bool written = format::WriteAll(fd, page, options.output).ok();
  if (::close(fd) != 0 || !written) {
    std::fprintf(stderr, "torchrr: error: %s: cannot write\n",
                 replayer::Printable(options.output).c_str());
    return kExitOther;
  }
  SayWrote(options.output, what);
  return rc;
}

}  // namespace

void RegisterReportCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* command = app.add_subcommand(
      "report",
      "Write the replay's verdicts as one self-contained HTML page, with the step's "
      "timeline and the autograd graph around each violation (drawn by Graphviz's dot)");
  AddTraceArgument(*command, &options->path);
  AddOutputOption(*command, &options->output, "The page (.html)", /*stdout_ok=*/true)->required();
  AddForceFlag(*command, &options->force);
  command
      ->add_option("--fix", options->fix_json,
                   "Show each violation's fix: the JSON `torchrr fix --json FILE` wrote")
      ->type_name("JSON");
  command->footer(ExitCodesFooter({kExitOk, kExitUsage, kExitNotATrace, kExitTruncated,
                                   kExitCorrupt, kExitTooNew, kExitOther, kExitMemory}));
  AddSourceRootOption(*command, &options->source_roots);
  command->callback([options, exit_code] { *exit_code = RunReport(*options); });
}

}  // namespace torchrr::cli
