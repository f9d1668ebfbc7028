// `torchrr replay FILE`: which op modified which saved tensor. The analysis is
// torchrr/replayer/replayer.h; this file reads the trace, prints the report, picks the exit code.
// RegisterReplayCommand (commands.h style) adds the verb to the command line.
#ifndef TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_
#define TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_

#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace torchrr::cli {

enum class ColorMode { kAuto, kAlways, kNever };

// What replay writes: the text report; the JSON document (replayer/SCHEMA.md); the few lines
// `record` prints (FormatShortVerdict); GNU diagnostic lines or a SARIF log for editors and CI
// (editor_formats.h).
enum class ReplayFormat { kText, kJson, kShort, kGnu, kSarif };

struct ReplayOptions {
  std::vector<std::string> paths;  // One trace, or several (one per rank).
  ReplayFormat format = ReplayFormat::kText;
  bool each = false;  // Every violation, not one diagnostic per group (FormatText's `each`).
  ColorMode color = ColorMode::kAuto;
  std::vector<std::string> source_roots;  // replayer::SetLocalSourceRoots; empty: the cwd.
};

// Whether the environment lets ColorMode::kAuto colour a terminal: not when NO_COLOR is set to
// anything but "" (no-color.org), nor when TERM is "dumb".
bool ColorWanted();

// Reads each trace of options.paths (streaming: records are analysed as they are read, not kept),
// writes each report to `out` (several: each under a "==> path <==" line, then a summary line
// per trace; JSON: {"traces": [...]}; GNU lines and SARIF: one output for all of them),
// problems with the files to stderr, and returns the exit code, the least clean over the traces
// (exit_codes.h, ReplayExitCode): a damaged or unreadable trace's (3 to 7), then 8 for an
// incomplete recording, then 1 for violations, else 0.
// `out_is_terminal` and ColorWanted() decide colour under ColorMode::kAuto.
int RunReplay(const ReplayOptions& options, std::ostream& out, bool out_is_terminal);

// Adds the `replay` subcommand to `app`. When it runs it stores its exit code in *exit_code.
void RegisterReplayCommand(CLI::App& app, int* exit_code);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_
