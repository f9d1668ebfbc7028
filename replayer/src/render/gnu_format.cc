// GNU diagnostic lines (editor_formats.h): `file:line:col: severity: message`, the form the GNU
// coding standards give compilers and that editors' problem matchers parse.
#include <sstream>
#include <string>

#include "render/diagnostics.h"
#include "torchrr/replayer/editor_formats.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {
namespace {

// "train.py:12:5": the statement's first column (1 when its source is not at hand, which keeps
// the three-field form every matcher takes). "train.py" without a line.
std::string GnuPlace(const DiagnosticPlace& place) {
  std::string text = Printable(place.file);
  if (place.line != 0) {
    text += ":" + std::to_string(place.line) + ":" + std::to_string(place.column);
  }
  return text;
}

//   train.py:12:5: error: saved tensor modified in place by aten::mul_; ... (40 times)
//   train.py:5:5: note: aten::sigmoid saved the tensor here for SigmoidBackward0
//   train.py:12:5: note: help: make aten::mul_ out of place (aten::mul), or .clone() ...
void EmitDiagnostic(const Diagnostic& d, const std::vector<ReplayedTrace>& traces,
                    std::ostream& out) {
  const std::string at = d.at ? GnuPlace(*d.at) : Printable(traces[d.traces.front()].path);
  out << at << ": error: " << d.message;
  if (d.count > 1) out << " (" << d.count << " times)";
  out << "\n";
  if (d.victim_at) out << GnuPlace(*d.victim_at) << ": note: " << d.victim_message << "\n";
  if (!d.help.empty()) out << at << ": note: help: " << d.help << "\n";
}

// What a trace's exit code says that no diagnostic does, placed at the trace:
//   run.trr: error: trace not read (not_a_trace): bad magic
//   run.trr: warning: trace truncated: analysed the records before the damage
//   run.trr: warning: the recording is incomplete: a write or use it missed could change this
void EmitTraceState(const ReplayedTrace& trace, std::ostream& out) {
  const std::string path = Printable(trace.path);
  const std::string message = trace.message.empty() ? "" : ": " + Printable(trace.message);
  if (!trace.report) {
    out << path << ": error: trace not read (" << trace.status << ")" << message << "\n";
    return;
  }
  const Report& report = *trace.report;
  if (trace.status != "ok") {
    out << path << ": warning: trace " << trace.status
        << ": analysed the records before the damage; culprits after it may be missing" << message
        << "\n";
  }
  if (report.incomplete()) {
    out << path << ": warning: the recording is incomplete (the recorder stopped early or lost "
                   "records): a write or use it missed could change these verdicts\n";
  }
  const bool found = !report.violations.empty() || !report.unexplained_errors.empty() ||
                     report.program_error.has_value();
  if (report.window() && !found) {
    out << path << ": warning: only steps " << report.first_step << " to " << report.last_step
        << " were kept: the steps before them were not checked\n";
  }
  if (report.ops == 0) {
    out << path << ": warning: the trace holds no op, so it says nothing of the run\n";
  }
}

}  // namespace

std::string FormatGnu(const std::vector<ReplayedTrace>& traces) {
  std::vector<const Report*> reports;
  for (const ReplayedTrace& trace : traces) {
    reports.push_back(trace.report ? &*trace.report : nullptr);
  }
  std::ostringstream out;
  for (const Diagnostic& d : CollectDiagnostics(reports)) EmitDiagnostic(d, traces, out);
  for (const ReplayedTrace& trace : traces) EmitTraceState(trace, out);
  return out.str();
}

}  // namespace torchrr::replayer
