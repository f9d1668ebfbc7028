// The exit codes of the `torchrr` command line, each named once: the verbs return these names,
// `torchrr --help` lists kExitCodeMeanings (main.cc), and the README's table is checked against
// it (tests/replayer/exit_codes_test.cc). Header-only, so that tests check the mapping without
// linking the command line.
#ifndef TORCHRR_REPLAYER_CLI_EXIT_CODES_H_
#define TORCHRR_REPLAYER_CLI_EXIT_CODES_H_

#include <string>

#include "torchrr/format/status.h"

namespace torchrr::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitViolations = 1;  // replay: violations or unexplained backward errors.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNotATrace = 3;  // Unreadable, or not a torchrr trace: nothing read.
inline constexpr int kExitTruncated = 4;  // What was before the cut was still used.
inline constexpr int kExitCorrupt = 5;    // What verifies was still used.
inline constexpr int kExitTooNew = 6;     // A newer format: nothing read.
inline constexpr int kExitOther = 7;      // An I/O error, or torchrr itself failed.
inline constexpr int kExitIncomplete = 8;  // replay: the recording misses part of the run.
// record: the program's torch is not the one the recorder was built against (the program is not
// run).
inline constexpr int kExitTorchMismatch = 9;
// replay: the trace holds no op, so it can say nothing of the run (a --steps range the run never
// reached, a recording that ended before the program's first op).
inline constexpr int kExitEmpty = 10;
// fix --check: the recorded command cannot be re-run here (not Python, its script missing).
inline constexpr int kExitNotRerun = 11;
// repro: no violation to reproduce, or one whose slice holds what a script cannot express (an
// autograd.Function, a compiled region, an op outside aten): no script is written.
inline constexpr int kExitNoRepro = 12;
// repro --check: the script ran and did not reproduce the violation (no error, another error, the
// same gradients, or past --timeout).
inline constexpr int kExitNotReproduced = 13;
// A verb that reads a trace needed more memory than its bound (memory_limit.h): a hostile or
// damaged trace, or --max-memory too low.
inline constexpr int kExitMemory = 14;
// replay: no violation, but the gradient stopped: backward raised "does not require grad", or
// trainable parameters got no gradient from a backward that ran (Report::gradient_cuts).
inline constexpr int kExitGradientCut = 15;
// replay: no violation and no cut, but a NaN or Inf reached the loss, a gradient or a weight
// (Report::non_finite).
inline constexpr int kExitNonFinite = 16;
inline constexpr int kExitNotRun = 127;  // record: the program could not be run (as a shell's).

struct ExitCodeMeaning {
  int code;
  const char* meaning;
};

inline constexpr ExitCodeMeaning kExitCodeMeanings[] = {
    {kExitOk, "ok"},
    {kExitViolations,
     "replay: violations found, or the program raised an error it does not explain; fix: a "
     "violation has no certain patch, or --check found one left"},
    {kExitUsage, "usage error"},
    {kExitNotATrace, "unreadable file, or not a torchrr trace"},
    {kExitTruncated, "trace truncated (data before the cut still used)"},
    {kExitCorrupt, "trace corrupt (data that verifies still used)"},
    {kExitTooNew, "trace written by a newer torchrr format"},
    {kExitOther, "other error"},
    {kExitIncomplete,
     "replay: the recording is incomplete (the recorder stopped early or lost records)"},
    {kExitTorchMismatch,
     "record: the program's torch is not the one torchrr was built against, or unsupported"},
    {kExitEmpty, "replay: the trace holds no op, so it says nothing of the run"},
    {kExitNotRerun, "fix --check: the recorded command cannot be re-run here"},
    {kExitNoRepro, "repro: no violation to reproduce, or one a script cannot express"},
    {kExitNotReproduced, "repro --check: the script ran and did not reproduce the violation"},
    {kExitMemory, "the trace needs more memory than the verb's bound (--max-memory)"},
    {kExitGradientCut,
     "replay: the gradient stopped: backward found no path to the loss, or trainable parameters "
     "got no gradient"},
    {kExitNonFinite, "replay: a NaN or Inf reached the loss, a gradient or a weight"},
    {kExitNotRun, "record: the program could not be run"},
};

// `torchrr --help`'s list of them.
inline std::string ExitCodesText() {
  std::string text = "Exit codes:\n";
  for (const ExitCodeMeaning& exit : kExitCodeMeanings) {
    std::string code = std::to_string(exit.code);
    text += "  " + code + std::string(code.size() < 3 ? 3 - code.size() : 1, ' ') + exit.meaning +
            "\n";
  }
  return text + "A damaged trace's code (4, 5) or 8 wins over 1: violations are still reported.\n";
}

// A read that gave nothing to show: not a trace, or too new.
constexpr bool NothingRead(int read_code) {
  return read_code == kExitNotATrace || read_code == kExitTooNew;
}

// A read after which a verb that writes an output has nothing to write from.
constexpr bool NothingToWrite(int read_code) {
  return NothingRead(read_code) || read_code == kExitOther;
}

// The exit code for how reading a trace ended: 0 ok, 3 not a trace or unreadable, 4 truncated
// (the data before the cut was still used), 5 corrupt (the data that verifies was still used),
// 6 too new, 7 an I/O or any other error. Never 1 or 2, which are not about the read.
constexpr int ExitCodeFor(format::StatusCode code) {
  switch (code) {
    case format::StatusCode::kOk: return kExitOk;
    case format::StatusCode::kNotATrace: return kExitNotATrace;
    case format::StatusCode::kTruncated: return kExitTruncated;
    case format::StatusCode::kCorrupt: return kExitCorrupt;
    case format::StatusCode::kTooNew: return kExitTooNew;
    default: return kExitOther;
  }
}

// replay's exit code, the least clean of what it found: a damaged trace's code (`read_code`, from
// ExitCodeFor) first, then an incomplete recording's, then a trace with no op (`empty`: whatever
// error of the program it kept, it holds no verdict), then violations; 0 only for a whole trace
// of a whole recording with ops and no violation. Violations found in a damaged or incomplete
// recording are reported all the same; the code says the verdict covers only part of the run.
// A gradient cut (`gradient_cut`) without violations is 15.
constexpr int ReplayExitCode(int read_code, bool incomplete, bool violations, bool empty,
                             bool gradient_cut = false, bool non_finite = false) {
  if (read_code != 0) return read_code;
  if (incomplete) return kExitIncomplete;
  if (empty) return kExitEmpty;
  if (violations) return kExitViolations;
  if (gradient_cut) return kExitGradientCut;
  return non_finite ? kExitNonFinite : kExitOk;
}

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_EXIT_CODES_H_
