// `torchrr replay FILE`: which op modified which saved tensor. The analysis is
// torchrr/replayer/replayer.h; this file reads the trace, prints the report, picks the exit code.
// RegisterReplayCommand (commands.h style) adds the verb to the command line.
#ifndef TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_
#define TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace torchrr::cli {

enum class ColorMode { kAuto, kAlways, kNever };

struct ReplayOptions {
  std::string path;
  bool json = false;
  ColorMode color = ColorMode::kAuto;
};

// Reads the trace at options.path (streaming: records are analysed as they are read, not kept),
// writes the report to `out`, problems with the file to stderr, and returns the exit code:
//   0 no violation; 1 violations found (also in a truncated or corrupt trace: what could be read
//   was analysed, and a warning says what was not); 3 not a trace or unreadable; 4 truncated and
//   5 corrupt (nothing found in what could be read); 6 written by a newer format; 7 other error.
// `out_is_terminal` decides colour under ColorMode::kAuto.
int RunReplay(const ReplayOptions& options, std::ostream& out, bool out_is_terminal);

// Adds the `replay` subcommand to `app`. When it runs it stores its exit code in *exit_code.
void RegisterReplayCommand(CLI::App& app, int* exit_code);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_REPLAY_COMMAND_H_
