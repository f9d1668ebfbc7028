#include "replay_command.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string_view>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/editor_formats.h"
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

}  // namespace

namespace {

// One trace's replay: its report written to `out` (text, or one JSON document into `json`; for
// the editor formats, kept with what the read found in `replayed`), its exit code returned, and
// a line for the summary of several traces in `verdict`.
int ReplayOne(const std::string& path, const ReplayOptions& options, std::ostream& out,
              bool color, nlohmann::json* json, replayer::ReplayedTrace* replayed,
              std::string* verdict) {
  replayer::Analyzer analyzer;
  format::ReadSummary summary =
      format::ReadTraceFile(path, [&](const format::Record& r) { analyzer.Add(r); });
  int read_code = ReportRead(path, summary);
  format::StatusCode code = summary.status.code();
  std::string name = replayer::Printable(path);
  if (summary.has_info && summary.info.rank >= 0) {
    name += " (rank " + std::to_string(summary.info.rank) + ")";
  }
  replayed->path = path;
  replayed->rank = summary.has_info ? summary.info.rank : -1;
  replayed->status = StatusName(code);
  replayed->message = summary.status.message();
  replayed->exit_code = read_code;
  if (!Analysable(code)) {
    *verdict = name + ": not read (" + std::string(StatusName(code)) + ")";
    return read_code;
  }
  replayer::Report report = FinishAnalysis(analyzer, summary);
  if (code != format::StatusCode::kOk) {
    std::cerr << "torchrr: warning: " << replayer::Printable(path) << ": analysed the "
              << summary.records()
              << " records that could be read; culprits after the damage may be missing\n";
  }
  if (options.format == ReplayFormat::kJson) {
    *json = replayer::ToJson(report);
    (*json)["trace"] = {{"path", path},
                        {"status", StatusName(code)},
                        {"torch", summary.has_info ? summary.info.torch_version : std::string()},
                        {"message", summary.status.message()},
                        {"warnings", summary.warnings}};
  } else if (options.format == ReplayFormat::kShort) {
    out << replayer::FormatShortVerdict(report, path);
  } else if (options.format == ReplayFormat::kText) {
    out << replayer::FormatText(report, color, options.each)
        << replayer::FixVerbLine(report, path);
  }
  const size_t n = report.violations.size();
  *verdict = name + ": " +
             (n != 0 ? std::to_string(n) + " violation" + (n == 1 ? "" : "s")
              : !report.unexplained_errors.empty() || report.program_error
                  ? "an error torchrr does not explain"
              : !report.gradient_cuts.empty()
                  ? "the gradient stopped at " + std::to_string(report.gradient_cuts.size()) +
                        " place" + (report.gradient_cuts.size() == 1 ? "" : "s")
              : report.non_finite
                  ? std::string(report.non_finite->nan ? "a NaN" : "an Inf") + " reached " +
                        report.non_finite->reached
              : report.ops == 0 ? "no op recorded"
                                : "no violation") +
             (code != format::StatusCode::kOk ? ", trace " + std::string(StatusName(code))
              : report.incomplete()             ? ", recording incomplete"
              : report.window()                 ? ", steps " + std::to_string(report.first_step) +
                                                      " to " + std::to_string(report.last_step) +
                                                      " kept"
                                                : "");
  const bool found = !report.violations.empty() || !report.unexplained_errors.empty() ||
                     report.program_error.has_value();
  // A window with nothing in it is no clean bill for the steps it did not keep.
  const bool cut = !report.gradient_cuts.empty();
  const bool non_finite = report.non_finite.has_value();
  replayed->exit_code = ReplayExitCode(
      read_code, report.incomplete() || (report.window() && !found && !cut && !non_finite), found,
      report.ops == 0, cut, non_finite);
  if (options.format == ReplayFormat::kGnu || options.format == ReplayFormat::kSarif) {
    replayed->report = std::move(report);
  }
  return replayed->exit_code;
}

// How unclean a replay exit code is: a damaged or unread trace, then an incomplete recording,
// then a trace with no op, then violations.
int Severity(int exit_code) {
  if (exit_code == kExitOk) return 0;
  if (exit_code == kExitGradientCut || exit_code == kExitNonFinite) return 1;
  if (exit_code == kExitViolations) return 2;
  if (exit_code == kExitEmpty) return 3;
  if (exit_code == kExitIncomplete) return 4;
  return 5;
}

}  // namespace

bool ColorWanted() {
  // https://no-color.org: any non-empty NO_COLOR; a dumb terminal draws no escape sequences.
  const char* no_color = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  return !(no_color != nullptr && *no_color != '\0') &&
         !(term != nullptr && std::string_view(term) == "dumb");
}

int RunReplay(const ReplayOptions& options, std::ostream& out, bool out_is_terminal) {
  const bool color = options.color == ColorMode::kAlways ||
                     (options.color == ColorMode::kAuto && out_is_terminal && ColorWanted());
  const bool several = options.paths.size() > 1;
  // The text and the short verdict are one report per trace, under its name; the other formats
  // write one document for all of them.
  const bool per_trace =
      options.format == ReplayFormat::kText || options.format == ReplayFormat::kShort;
  replayer::SetLocalSourceRoots(options.source_roots);
  int exit_code = 0;
  nlohmann::json traces = nlohmann::json::array();
  std::vector<replayer::ReplayedTrace> replayed;
  std::vector<std::string> verdicts;
  for (const std::string& path : options.paths) {
    if (several && per_trace) out << "==> " << replayer::Printable(path) << " <==\n";
    nlohmann::json json;
    std::string verdict;
    int code = ReplayOne(path, options, out, color, &json, &replayed.emplace_back(), &verdict);
    if (Severity(code) > Severity(exit_code)) exit_code = code;
    if (options.format == ReplayFormat::kJson && !json.is_null()) traces.push_back(std::move(json));
    verdicts.push_back(std::move(verdict));
    if (several && per_trace) out << "\n";
  }
  if (options.format == ReplayFormat::kGnu) {
    out << replayer::FormatGnu(replayed);
  } else if (options.format == ReplayFormat::kSarif) {
    out << JsonText(replayer::ToSarif(replayed, TORCHRR_VERSION), 2) << "\n";
  } else if (options.format == ReplayFormat::kJson) {
    // One trace: its document. Several (one per rank): {"traces": [document, ...]}.
    if (!several && !traces.empty()) out << JsonText(traces[0], 2) << "\n";
    if (several) out << JsonText(nlohmann::json{{"traces", traces}}, 2) << "\n";
  } else if (several && per_trace) {
    out << "summary of " << verdicts.size() << " traces:\n";
    for (const std::string& verdict : verdicts) out << "  " << verdict << "\n";
  }
  out.flush();
  return exit_code;
}

void RegisterReplayCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ReplayOptions>();
  CLI::App* replay = app.add_subcommand(
      "replay", "Find which op, on which line, modified which saved tensor (the culprit behind "
                "\"modified by an inplace operation\")");
  replay->add_option("FILE", options->paths,
                     "Trace file (.trr); several (one per rank: run.rank*.trr) are replayed one "
                     "after the other, with a summary")
      ->required();
  const std::map<std::string, ReplayFormat> formats{
      {"text", ReplayFormat::kText}, {"json", ReplayFormat::kJson},
      {"short", ReplayFormat::kShort}, {"gnu", ReplayFormat::kGnu},
      {"sarif", ReplayFormat::kSarif}};
  CLI::Option* format =
      replay
          ->add_option("--format", options->format,
                       "What to print: text (the report, the default); json (one document, "
                       "schema: replayer/SCHEMA.md); short (each distinct culprit and victim "
                       "line with the fix, as `record` prints after the program); gnu (one "
                       "`file:line:col: error: message` line per distinct diagnostic, for "
                       "editors' problem matchers and Emacs' compilation-mode); sarif (one "
                       "SARIF 2.1.0 log, for code-scanning views). Several traces: one gnu "
                       "output, one SARIF run")
          ->transform(CLI::CheckedTransformer(formats, CLI::ignore_case))
          ->option_text("text|json|short|gnu|sarif");
  CLI::Option* json = replay->add_flag_callback(
      "--json", [options] { options->format = ReplayFormat::kJson; }, "Same as --format json");
  replay
      ->add_flag_callback("--short", [options] { options->format = ReplayFormat::kShort; },
                          "Same as --format short")
      ->excludes(json)
      ->excludes(format);
  json->excludes(format);
  replay->add_flag("--all", options->each,
                   "Print every violation; by default violations with the same kind, culprit "
                   "line and victim line are one diagnostic that says how many and in which steps");
  const std::map<std::string, ColorMode> colors{
      {"auto", ColorMode::kAuto}, {"always", ColorMode::kAlways}, {"never", ColorMode::kNever}};
  replay
      ->add_option("--color", options->color,
                   "Colour the text report: auto (the default: when stdout is a terminal, unless "
                   "NO_COLOR is set or TERM is dumb), always, never")
      ->transform(CLI::CheckedTransformer(colors, CLI::ignore_case))
      ->option_text("auto|always|never");
  replay->footer(ExitCodesFooter(
      {kExitOk, kExitViolations, kExitUsage, kExitNotATrace, kExitTruncated, kExitCorrupt,
       kExitTooNew, kExitOther, kExitIncomplete, kExitEmpty, kExitMemory, kExitGradientCut,
       kExitNonFinite},
      "A damaged trace's code (4, 5) or 8 wins over 1: violations are still reported. 1 wins "
      "over 15, and 15 over 16."));
  AddSourceRootOption(*replay, &options->source_roots);
  replay->callback([options, exit_code] {
    *exit_code = RunReplay(*options, std::cout, isatty(STDOUT_FILENO) != 0);
  });
}

}  // namespace torchrr::cli
