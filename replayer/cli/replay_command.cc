#include "replay_command.h"

#include <unistd.h>

#include <iostream>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::cli {
namespace {

const char* StatusName(format::StatusCode code) {
  switch (code) {
    case format::StatusCode::kOk: return "ok";
    case format::StatusCode::kTruncated: return "truncated";
    case format::StatusCode::kCorrupt: return "corrupt";
    case format::StatusCode::kTooNew: return "too_new";
    case format::StatusCode::kNotATrace: return "not_a_trace";
    case format::StatusCode::kInvalidArgument: return "invalid_argument";
    case format::StatusCode::kIoError: return "io_error";
  }
  return "unknown";
}

// Statuses after which the records read are still worth analysing.
bool Analysable(format::StatusCode code) {
  return code == format::StatusCode::kOk || code == format::StatusCode::kTruncated ||
         code == format::StatusCode::kCorrupt;
}

}  // namespace

int RunReplay(const ReplayOptions& options, std::ostream& out, bool out_is_terminal) {
  replayer::Analyzer analyzer;
  format::ReadSummary summary =
      format::ReadTraceFile(options.path, [&](const format::Record& r) { analyzer.Add(r); });
  int read_code = ReportRead(options.path, summary);
  format::StatusCode code = summary.status.code();
  if (!Analysable(code)) return read_code;
  replayer::Report report = analyzer.Finish();
  if (code != format::StatusCode::kOk) {
    std::cerr << "torchrr: warning: " << replayer::Printable(options.path) << ": analysed the "
              << summary.records()
              << " records that could be read; culprits after the damage may be missing\n";
  }
  if (options.json) {
    nlohmann::json j = replayer::ToJson(report);
    j["trace"] = {{"path", options.path},
                  {"status", StatusName(code)},
                  {"message", summary.status.message()},
                  {"warnings", summary.warnings}};
    out << JsonText(j, 2) << "\n";
  } else {
    bool color = options.color == ColorMode::kAlways ||
                 (options.color == ColorMode::kAuto && out_is_terminal);
    out << replayer::FormatText(report, color);
  }
  out.flush();
  return ReplayExitCode(read_code, report.incomplete(),
                        !report.violations.empty() || !report.unexplained_errors.empty());
}

void RegisterReplayCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReplayOptions>();
  CLI::App* replay = app.add_subcommand(
      "replay", "Find which op, on which line, modified which saved tensor (the culprit behind "
                "\"modified by an inplace operation\")");
  replay->add_option("FILE", options->path, "Trace file (.trr)")->required();
  replay->add_flag("--json", options->json,
                   "Print one JSON document (schema: replayer/SCHEMA.md) instead of text");
  const std::map<std::string, ColorMode> colors{
      {"auto", ColorMode::kAuto}, {"always", ColorMode::kAlways}, {"never", ColorMode::kNever}};
  replay->add_option("--color", options->color, "Colour the text report: auto, always, never")
      ->transform(CLI::CheckedTransformer(colors, CLI::ignore_case));
  replay->callback([options, exit_code] {
    *exit_code = RunReplay(*options, std::cout, isatty(STDOUT_FILENO) != 0);
  });
}

}  // namespace torchrr::cli
