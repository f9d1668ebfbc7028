// The replay's verdicts in the formats editors and CI read: GNU diagnostic lines
// (`file:line:col: error: message`, what Emacs' compilation-mode and VS Code's problem matchers
// parse) and a SARIF 2.1.0 log (what code-scanning views show). The text report is for a person;
// these put the culprit's line where the user already is, one diagnostic per distinct bug.
//
// A diagnostic is a violation, an unexplained backward error or the program's error, at the
// culprit's user line (else the victim's, else the trace itself). Its message names no version,
// step or backward pass, so that the same bug in every step and on every rank is one diagnostic
// with a count, however many instances the report holds.
#ifndef TORCHRR_REPLAYER_EDITOR_FORMATS_H_
#define TORCHRR_REPLAYER_EDITOR_FORMATS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// One trace given to `torchrr replay`, and what its replay found.
struct ReplayedTrace {
  std::string path;              // As given on the command line.
  int rank = -1;                 // The trace's rank (FileInfo); -1 when it names none.
  std::optional<Report> report;  // nullopt when nothing could be read.
  std::string status = "ok";     // How the read ended: "ok", "truncated", "corrupt", "not_a_trace".
  std::string message;           // The reader's message when `status` is not "ok".
  int exit_code = 0;             // replay's exit code for this trace alone (cli/exit_codes.h).
};

// One line per distinct diagnostic over all `traces`, in the order of their first instance:
//   train.py:12:1: error: saved tensor modified in place by aten::mul_; aten::sigmoid at
//       train.py:5 saved it for SigmoidBackward0 (40 times)          <- one line, wrapped here
//   train.py:5:1: note: aten::sigmoid saved the tensor here for SigmoidBackward0
//   train.py:12:1: note: help: make aten::mul_ out of place (aten::mul), or .clone() ...
// The column is always 1: traces record lines, not columns. A diagnostic with no line in the
// user's code is placed at the trace (`run.trr: error: ...`); so are a trace that could not be
// read (error), a damaged trace and an incomplete recording (warning), after the diagnostics.
// Every string from a trace is escaped (Printable): a message stays on its line. "" when there
// is nothing to say. Reads no file. Thread-safe.
std::string FormatGnu(const std::vector<ReplayedTrace>& traces);

// One SARIF 2.1.0 log of all `traces`: one run of the tool "torchrr" (`tool_version`), one
// invocation per trace in the order given (executionSuccessful false for a trace that could not
// be read, with the reader's message as a tool execution notification), one result per distinct
// diagnostic over all of them, merged as FormatGnu merges them (properties.traces names the
// invocations it came from). The layout is docs/report.md's "For editors and CI". Thread-safe.
nlohmann::json ToSarif(const std::vector<ReplayedTrace>& traces, std::string_view tool_version);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_EDITOR_FORMATS_H_
