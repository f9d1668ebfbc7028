// `torchrr export FILE -o OUT.json`: the trace as a Chrome Trace Event file for Perfetto's UI and
// chrome://tracing (chrome_trace.h says what becomes what), the one format export writes
// (--chrome-trace names it, and may be left out). `-o -` writes it to stdout.
#include <cstdio>
#include <iostream>
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
  bool force = false;
};

int RunExport(const ExportOptions& options) {
  const bool to_stdout = options.output == kStdout;
  int refused = 0;
  if (!to_stdout) {
    if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
    if (CheckOutputFile(options.output, replayer::kChromeTracePrefix, options.force, &refused) !=
        0) {
      return refused;
    }
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

  // Pass 2: the events, in the order read.
  auto write = [&](std::ostream& out) {
    replayer::ChromeTraceWriter writer(out, plan, report, summary.info);
    (void)format::ReadTraceFile(options.path, [&](const format::Record& r) { writer.Add(r); });
    writer.Finish();
    out.flush();
  };
  bool written = false;
  if (to_stdout) {
    write(std::cout);
    written = static_cast<bool>(std::cout);
  } else {
    const int fd =
        OpenOutputFile(options.output, replayer::kChromeTracePrefix, options.force, &refused);
    if (fd < 0) return refused;
    format::OutputFileBuffer file(fd, options.output);
    std::ostream out(&file);
    write(out);
    written = file.Close().ok();
  }
  if (!written) {
    std::fprintf(stderr, "torchrr: error: %s: write failed\n",
                 to_stdout ? "stdout" : replayer::Printable(options.output).c_str());
    return kExitOther;
  }
  const size_t n = report.violations.size();
  SayWrote(options.output, "Chrome Trace Event JSON, " + std::to_string(report.ops) + " ops, " +
                               std::to_string(n) + " violation" + (n == 1 ? "" : "s") +
                               "; open it in ui.perfetto.dev");
  return rc;
}

}  // namespace

void RegisterExportCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ExportOptions>();
  CLI::App* command = app.add_subcommand(
      "export", "Write a trace in another tool's format (a damaged trace: what verifies)");
  AddTraceArgument(*command, &options->path);
  // The one format, and the default: the flag stays for the command lines that name it.
  command->add_flag_callback(
      "--chrome-trace", [] {},
      "Chrome Trace Event JSON, for ui.perfetto.dev and chrome://tracing: ops, backward nodes, "
      "CUDA kernels, violations (the default, and only, format)");
  AddOutputOption(*command, &options->output, "The JSON file (.json)", /*stdout_ok=*/true)
      ->required();
  AddForceFlag(*command, &options->force);
  command->footer(ExitCodesFooter(
      {kExitOk, kExitUsage, kExitNotATrace, kExitTruncated, kExitCorrupt, kExitTooNew, kExitOther,
       kExitMemory}));
  command->callback([options, exit_code] { *exit_code = RunExport(*options); });
}

}  // namespace torchrr::cli
