// `torchrr repro FILE -o OUT.py`: a standalone Python script, using only torch, that reproduces
// one violation from the trace alone (torchrr/replayer/repro.h says what it holds).
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "commands.h"
#include "torchrr/format/output_file.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"

namespace torchrr::cli {
namespace {

struct ReproCommandOptions {
  std::string path;
  std::string output;
  size_t violation = 0;
  std::string device;
  bool force = false;
};

// `-o -`: the script goes to stdout (`torchrr repro run.trr -o - | python`), and no file is
// checked, replaced or written.
constexpr std::string_view kStdout = "-";

int RunRepro(const ReproCommandOptions& options) {
  const bool to_stdout = options.output == kStdout;
  int refused = 0;
  if (!to_stdout) {
    if (int rc = RefuseOverwrite(options.path, options.output); rc != 0) return rc;
    if (CheckOutputFile(options.output, replayer::kReproPrefix, options.force, &refused) != 0) {
      return refused;
    }
  }
  // The slice walks back from the culprit, so the records stay in memory.
  replayer::Analyzer analyzer;
  std::vector<format::Record> records;
  format::ReadSummary summary = format::ReadTraceFile(options.path, [&](const format::Record& r) {
    analyzer.Add(r);
    records.push_back(r);
  });
  int rc = ReportRead(options.path, summary);
  if (NothingToWrite(rc)) return rc;
  replayer::Report report = FinishAnalysis(analyzer, summary);

  replayer::ReproOptions repro_options;
  repro_options.violation = options.violation;
  repro_options.device = options.device;
  repro_options.trace_name = options.path;
  replayer::Repro repro = replayer::WriteRepro(records, report, summary.info, repro_options);
  if (!repro.ok) {
    std::fprintf(stderr, "torchrr: error: %s: no reproducer: %s\n",
                 replayer::Printable(options.path).c_str(), repro.error.c_str());
    return kExitNoRepro;
  }
  const int fd = to_stdout ? STDOUT_FILENO
                           : OpenOutputFile(options.output, replayer::kReproPrefix,
                                            options.force, &refused);
  if (fd < 0) return refused;
  const bool written = format::WriteAll(fd, repro.script, options.output).ok();
  if ((!to_stdout && ::close(fd) != 0) || !written) {
    std::fprintf(stderr, "torchrr: error: %s: write failed\n",
                 replayer::Printable(options.output).c_str());
    return kExitOther;
  }
  std::fprintf(stderr, "torchrr: wrote %s: violation %zu, %zu of the trace's %llu ops\n",
               replayer::Printable(options.output).c_str(), options.violation, repro.slice_ops,
               static_cast<unsigned long long>(repro.trace_ops));
  return rc;
}

}  // namespace

void RegisterReproCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReproCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "repro", "Write a standalone Python script, using only torch, that reproduces a violation");
  command->add_option("FILE", options->path, "Trace file (.trr)")->required();
  command->add_option("-o,--output", options->output, "Output script (.py); - for stdout")
      ->required();
  command->add_option("--violation", options->violation,
                      "Which violation, from 0 in the order of `torchrr replay --json` "
                      "(default: the first)");
  command->add_option("--device", options->device,
                      "Where the script runs the recorded non-CPU tensors (default: the recorded "
                      "device when the machine has it, else the CPU)");
  command->add_flag("--force", options->force,
                    "Replace the output even when it is a file this verb did not write");
  command->callback([options, exit_code] { *exit_code = RunRepro(*options); });
}

}  // namespace torchrr::cli
