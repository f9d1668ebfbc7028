// The few lines `torchrr record` prints after a recorded program ends, when its trace holds a
// violation: each distinct culprit and victim line with its code, the fix, and the commands for
// the rest. The whole report is text_report.cc's.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "source_files.h"
#include "text_words.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

// Distinct places shown at most: the verdict stays within a screen.
constexpr size_t kMaxPlaces = 3;

// "       12 | y.mul_(2)" (indentation dropped), the line the full report would quote (SourceCache);
// "" when there is none.
std::string CodeLine(SourceCache& sources, const std::optional<OpRef>& op) {
  if (!op || !op->user_frame) return "";
  const std::string* line = sources.Line(op->user_frame->file, op->user_frame->line);
  const std::string code = line == nullptr ? "" : Unindented(*line);
  if (code.empty()) return "";
  std::string number = std::to_string(op->user_frame->line);
  return "    " + std::string(number.size() < 5 ? 5 - number.size() : 0, ' ') + number + " | " +
         code + "\n";
}

// "           run inside transformers/activations.py:103 in SiLUActivation.forward" under an op
// that a library ran for its line (LibraryLocation); "" when none did.
std::string RunInside(const OpRef& op) {
  const std::string library = LibraryLocation(op);
  return library.empty() ? "" : "           run inside " + library + "\n";
}

// "the whole report: torchrr replay run.trr; as a page: torchrr report run.trr -o run.html".
std::string WholeReportLine(const std::string& trace) {
  std::string page = trace;
  if (page.ends_with(".trr")) page.resize(page.size() - 4);
  const std::string shown = Printable(trace);
  return "the whole report: torchrr replay " + shown + "; as a page: torchrr report " + shown +
         " -o " + Printable(page) + ".html\n";
}

// The gradient cuts, when the trace has no violation: where the gradient stopped, its code, the
// parameters it kept from backward, and the help.
std::string GradientCutVerdict(const Report& report, const std::string& trace) {
  const std::string shown = Printable(trace);
  SourceCache sources(&report.sources);
  std::ostringstream out;
  for (size_t i = 0; i < report.gradient_cuts.size() && i < kMaxPlaces; ++i) {
    const GradientCut& cut = report.gradient_cuts[i];
    out << "torchrr: the gradient stopped in " << shown << ": "
        << (cut.raised ? "backward found no path from a trainable parameter to the loss"
                       : std::to_string(cut.parameter_count) + " trainable parameter" +
                             (cut.parameter_count == 1 ? "" : "s") + " got no gradient")
        << "\n";
    const std::optional<OpRef>& at = cut.checkpoint ? cut.checkpoint : cut.op;
    if (at) {
      out << "  cut:     " << Location(*at) << "\n"
          << CodeLine(sources, at) << "           " << OpName(*at) << " ("
          << CutCauseName(cut.cause) << ")\n"
          << RunInside(*at);
    } else {
      out << "  cut:     no recorded op connects the loss to a parameter that requires grad\n";
    }
    if (cut.parameter_count != 0) out << "  params:  " << Printable(cut.summary) << "\n";
    if (cut.loss) out << "  loss:    " << Location(*cut.loss) << "\n";
    out << "  help: " << Printable(cut.help) << "\n";
  }
  out << WholeReportLine(trace);
  return out.str();
}

// The first NaN or Inf, when the trace has no violation and no cut: the op that made it, its
// code, what it reached, and the help.
std::string NonFiniteVerdict(const Report& report, const std::string& trace) {
  const NonFinite& n = *report.non_finite;
  const std::string shown = Printable(trace);
  SourceCache sources(&report.sources);
  std::ostringstream out;
  const std::string what = n.nan ? "NaN" : "Inf";
  out << "torchrr: " << (n.nan ? "a " : "an ") << what << " reached " << n.reached << " in "
      << shown;
  if (n.step != UINT64_MAX) out << " (step " << n.step << ")";
  out << "\n";
  const OpRef& at = n.backward && n.forward ? *n.forward : n.op;
  if (at.id != 0) {
    out << "  first:   " << Location(at) << "\n"
        << CodeLine(sources, std::optional<OpRef>(at)) << "           "
        << (n.backward ? n.op.name + " (the backward of " + OpName(at) + ")" : OpName(at))
        << " made it (" << NonFiniteCauseName(n.cause)
        << (n.dtype.empty() ? "" : ", " + n.dtype) << ")\n"
        << RunInside(at);
  }
  if (n.became_nan) out << "  nan at:  " << Location(*n.became_nan) << "\n";
  if (n.later_ops != 0) out << "  then:    " << n.later_ops << " later ops carried it on\n";
  out << "  help: " << Printable(n.help) << "\n";
  out << WholeReportLine(trace);
  return out.str();
}

}  // namespace

std::string FormatShortVerdict(const Report& report, const std::string& trace) {
  if (report.violations.empty() && !report.gradient_cuts.empty()) {
    return GradientCutVerdict(report, trace);
  }
  if (report.violations.empty() && report.non_finite) return NonFiniteVerdict(report, trace);
  if (report.violations.empty()) return "";
  const std::string shown = Printable(trace);
  const size_t n = report.violations.size();
  SourceCache sources(&report.sources);
  std::ostringstream out;
  out << "torchrr: " << n << " violation" << (n == 1 ? "" : "s") << " in " << shown;
  if (report.violations.front().pytorch_raised) out << "; the first is the error PyTorch raised";
  if (report.incomplete()) out << " (the recording is incomplete)";
  out << "\n";
  // Places in the order of their first violation (the first is the one PyTorch stopped at).
  for (size_t i = 0; i < report.groups.size() && i < kMaxPlaces; ++i) {
    const ViolationGroup& group = report.groups[i];
    const Violation* v = &report.violations[group.violations.front()];
    const size_t count = group.violations.size();
    if (v->culprit) {
      out << "  culprit: " << Location(*v->culprit) << "\n"
          << CodeLine(sources, v->culprit) << "           " << CulpritLabel(*v) << "\n"
          << RunInside(*v->culprit);
    } else {
      out << "  culprit: not recorded (the write happened outside any recorded op)\n";
    }
    if (v->changed_source) {
      out << "  values from: " << Location(*v->changed_source) << "\n"
          << CodeLine(sources, v->changed_source);
    }
    if (v->victim) {
      out << "  victim:  " << Location(*v->victim) << "\n" << CodeLine(sources, v->victim)
          << RunInside(*v->victim);
    }
    out << "  help: " << FixHint(*v) << "\n";
    if (count > 1) out << "  (" << TimesAndSteps(group) << ")\n";
  }
  if (report.groups.size() > kMaxPlaces) {
    const size_t more = report.groups.size() - kMaxPlaces;
    out << "  and " << more << " more place" << (more == 1 ? "" : "s") << "\n";
  }
  out << FixVerbLine(report, trace);
  out << WholeReportLine(trace);
  return out.str();
}

FixLanguage FixVerbMayPatch(const Violation& v) {
  const std::optional<OpRef>& culprit = v.changed_source ? v.changed_source : v.culprit;
  if (!culprit || !culprit->user_frame) return FixLanguage::kNone;
  // A freed graph (retain_graph=True on the first of two backward() calls on one loss) and an
  // unpack hook (cast back, or the saved tensor itself) have rewrites in Python only.
  const bool python_only = v.kind == ViolationKind::kFreed ||
                           v.kind == ViolationKind::kUnpackHook || culprit->hook;
  const UserFrame& line = *culprit->user_frame;
  bool python = line.file.ends_with(".py");
  for (const Frame& frame : culprit->stack) {
    if (frame.file == line.file && frame.line == line.line) {
      python = frame.python;
      break;
    }
  }
  if (python) return FixLanguage::kPython;
  if (python_only) return FixLanguage::kNone;
  for (const char* ext : {".cc", ".cpp", ".cxx", ".c++", ".h", ".hpp", ".hh", ".cu"}) {
    if (line.file.ends_with(ext)) return FixLanguage::kCpp;
  }
  return FixLanguage::kNone;
}

std::string FixVerbLine(const Report& report, const std::string& trace) {
  bool cpp = false;
  bool no_line = false;
  for (const Violation& v : report.violations) {
    const FixLanguage language = FixVerbMayPatch(v);
    if (language == FixLanguage::kPython) {
      return "try: torchrr fix " + Printable(trace) +
             " --check (a patch for the culprit's Python line, checked by re-running the "
             "program)\n";
    }
    cpp = cpp || language == FixLanguage::kCpp;
    // A native frame named by its symbol alone: the program has no line table (no -g).
    const std::optional<OpRef>& culprit = v.changed_source ? v.changed_source : v.culprit;
    no_line = no_line || (culprit && !culprit->hook && culprit->user_frame &&
                          culprit->user_frame->file.empty() &&
                          !culprit->user_frame->function.empty());
  }
  if (cpp) {
    return "try: torchrr fix " + Printable(trace) +
           " --check (a patch for the culprit's C++ line, checked by building the program "
           "again and re-running it)\n";
  }
  return no_line ? "note: the culprit's C++ function has no file and line: the program was "
                   "built without debug info; build it with -g (CMake: "
                   "-DCMAKE_BUILD_TYPE=RelWithDebInfo) and record again to have its line named "
                   "and a patch for it\n"
                 : "";
}

}  // namespace torchrr::replayer
