// The exit codes of the `torchrr` command line, as `torchrr --help` lists them (main.cc):
//   0 ok, 1 replay found violations, 2 usage error, 3 unreadable file or not a torchrr trace,
//   4 trace truncated, 5 trace corrupt, 6 trace written by a newer format, 7 any other error,
//   8 replay: the recording is incomplete (the recorder stopped early or lost records),
//   9 record: the program's torch is not the one torchrr was built against, or is unsupported.
// Header-only, so that tests check the mapping without linking the command line.
#ifndef TORCHRR_REPLAYER_CLI_EXIT_CODES_H_
#define TORCHRR_REPLAYER_CLI_EXIT_CODES_H_

#include "torchrr/format/status.h"

namespace torchrr::cli {

inline constexpr int kExitViolations = 1;  // replay: violations or unexplained backward errors.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitIncomplete = 8;  // replay: the recording misses part of the run.
// record: the program's torch is not the one the recorder was built against (the program is not
// run).
inline constexpr int kExitTorchMismatch = 9;

// The exit code for how reading a trace ended: 0 ok, 3 not a trace or unreadable, 4 truncated
// (the data before the cut was still used), 5 corrupt (the data that verifies was still used),
// 6 too new, 7 an I/O or any other error. Never 1 or 2, which are not about the read.
constexpr int ExitCodeFor(format::StatusCode code) {
  switch (code) {
    case format::StatusCode::kOk: return 0;
    case format::StatusCode::kNotATrace: return 3;
    case format::StatusCode::kTruncated: return 4;
    case format::StatusCode::kCorrupt: return 5;
    case format::StatusCode::kTooNew: return 6;
    default: return 7;
  }
}

// replay's exit code, the least clean of what it found: a damaged trace's code (`read_code`, from
// ExitCodeFor) first, then an incomplete recording's, then violations; 0 only for a whole trace
// of a whole recording with none. Violations found in a damaged or incomplete recording are
// reported all the same; the code says the verdict covers only part of the run.
constexpr int ReplayExitCode(int read_code, bool incomplete, bool violations) {
  if (read_code != 0) return read_code;
  if (incomplete) return kExitIncomplete;
  return violations ? kExitViolations : 0;
}

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_EXIT_CODES_H_
