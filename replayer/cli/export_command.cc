// `torchrr export --chrome-trace FILE -o OUT.json`: the trace as a Chrome Trace Event file for
// Perfetto's UI and chrome://tracing (chrome_trace.h says what becomes what).
#include <cstdio>
#include <ostream>
#include <memory>
#include <string>

#include "torchrr/replayer/chrome_trace.h"
#include "commands.h"
#include "torchrr/format/output_file.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {
namespace {

struct ExportOptions {
  std::string path;
  std::string output;
  bool chrome_trace = false;
  bool force = false;
};

int RunExport(const ExportOptions& options) {
  if (!options.chrome_trace) {
    std::fprintf(stderr, "torchrr: error: export: name a format (--chrome-trace)\n");
    return kExitUsage;
  }
  if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
  int refused = 0;
  if (CheckOutputFile(options.output, replayer::kChromeTracePrefix, options.force, &refused) != 0) {
    return refused;
  }
  // Pass 1: the analysis and what the events need to know ahead (chrome_trace.h).
  replayer::Analyzer analyzer;
  replayer::ChromeTracePlan plan;
  format::ReadSummary summary = format::ReadTraceFile(options.path, [&](const format::Record& r) {
    analyzer.Add(r);
    plan.See(r);
  });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  replayer::Report report = FinishAnalysis(analyzer, summary);

  const int fd =
      OpenOutputFile(options.output, replayer::kChromeTracePrefix, options.force, &refused);
  if (fd < 0) return refused;
  format::OutputFileBuffer file(fd, options.output);
  std::ostream out(&file);
  replayer::ChromeTraceWriter writer(out, plan, report, summary.info);
  (void)format::ReadTraceFile(options.path, [&](const format::Record& r) { writer.Add(r); });
  writer.Finish();
  out.flush();
  if (!file.Close().ok()) {
    std::fprintf(stderr, "torchrr: error: %s: write failed\n",
                 replayer::Printable(options.output).c_str());
    return kExitOther;
  }
  return rc;
}

}  // namespace

void RegisterExportCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ExportOptions>();
  CLI::App* command = app.add_subcommand(
      "export", "Write a trace in another tool's format (a damaged trace: what verifies)");
  command->add_option("FILE", options->path, "Trace file (.trr)")->required();
  command
      ->add_flag("--chrome-trace", options->chrome_trace,
                 "Chrome Trace Event JSON, for ui.perfetto.dev and chrome://tracing: ops, "
                 "backward nodes, CUDA kernels, violations")
      ->required();
  command->add_option("-o,--output", options->output, "Output file (.json)")->required();
  command->add_flag("--force", options->force,
                    "Replace the output even when it is a file this verb did not write");
  command->callback([options, exit_code] { *exit_code = RunExport(*options); });
}

}  // namespace torchrr::cli
