// `torchrr report FILE -o report.html`: the replay's verdicts as one self-contained HTML page
// (html_report.h) with the step's timeline and the autograd graph around each violation.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "torchrr/replayer/autograd_graph.h"
#include "commands.h"
#include "torchrr/replayer/graphviz.h"
#include "torchrr/replayer/html_report.h"
#include "torchrr/replayer/step_timeline.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/trace_tables.h"

namespace torchrr::cli {
namespace {

struct ReportOptions {
  std::string path;
  std::string output;
};

int RunReport(const ReportOptions& options) {
  if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
  // Pass 1: the analysis, which says what the drawings mark.
  replayer::Analyzer analyzer;
  format::ReadSummary summary =
      format::ReadTraceFile(options.path, [&](const format::Record& r) { analyzer.Add(r); });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  const replayer::Report report = FinishAnalysis(analyzer, summary);

  // Pass 2: the graph and the timeline.
  replayer::TraceTables tables;
  replayer::AutogradGraph graph;
  replayer::StepTimeline timeline(report);
  (void)format::ReadTraceFile(options.path, [&](const format::Record& r) {
    tables.See(r);
    graph.See(r);
    timeline.See(r, tables);
  });

  replayer::HtmlReportParts parts;
  parts.trace_path = options.path;
  parts.summary = &summary;
  parts.report = &report;
  parts.timeline_svg = timeline.Svg();
  for (const replayer::Violation& v : report.violations) {
    if (!parts.graph_problem.empty()) break;
    format::StatusOr<std::string> svg = replayer::DotToSvg(graph.Dot(v, tables));
    if (!svg.ok()) {
      parts.graph_problem = svg.status().message();
      std::fprintf(stderr, "torchrr: warning: no autograd graphs in the report: %s\n",
                   parts.graph_problem.c_str());
      break;
    }
    parts.graph_svgs.push_back(*svg);
  }

  std::ofstream out(options.output, std::ios::binary | std::ios::trunc);
  out << replayer::HtmlReport(parts);
  out.close();
  if (!out) {
    std::fprintf(stderr, "torchrr: error: %s: cannot write\n",
                 replayer::Printable(options.output).c_str());
    return kExitOther;
  }
  return rc;
}

}  // namespace

void RegisterReportCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* command = app.add_subcommand(
      "report",
      "Write the replay's verdicts as one self-contained HTML page, with the step's "
      "timeline and the autograd graph around each violation (drawn by Graphviz's dot)");
  command->add_option("FILE", options->path, "Trace file (.trr)")->required();
  command->add_option("-o,--output", options->output, "The page (.html)")->required();
  command->callback([options, exit_code] { *exit_code = RunReport(*options); });
}

}  // namespace torchrr::cli
