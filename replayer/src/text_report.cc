// The human report: one diagnostic per violation, laid out like a compiler's (culprit first, then
// the victim, then the facts, then a fix). TextReport writes it one section at a time, each by its
// own short emitter, whose comment shows what it writes. Every string from the trace (names,
// files, messages, source lines) goes through Printable where it enters the report.
#include <cstdio>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "source_files.h"
#include "text_words.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

class Painter {
 public:
  explicit Painter(bool color) : color_(color) {}
  std::string Paint(const char* code, const std::string& text) const {
    return color_ ? std::string("\x1b[") + code + "m" + text + "\x1b[0m" : text;
  }
  std::string Error(const std::string& t) const { return Paint("1;31", t); }
  std::string Warning(const std::string& t) const { return Paint("1;33", t); }
  std::string Note(const std::string& t) const { return Paint("1;36", t); }
  std::string Help(const std::string& t) const { return Paint("1;32", t); }
  std::string Bold(const std::string& t) const { return Paint("1", t); }
  std::string Gutter(const std::string& t) const { return Paint("1;34", t); }

 private:
  bool color_;
};

// "[4, 8]"
std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Writes one report. Not thread-safe; one per FormatText call.
class TextReport {
 public:
  TextReport(bool color, const Report& report) : p_(color), sources_(&report.sources) {}

  void EmitRecordingStop(const RecordingStop& stop);
  void EmitWarning(const std::string& warning);
  void EmitViolation(const Violation& v, const ViolationGroup* group);
  void EmitChangedSource(const Violation& v);
  void EmitUnexplainedError(const UnexplainedError& error);
  void EmitProgramError(const ProgramError& error);
  void EmitGradientCut(const GradientCut& cut);
  void EmitNonFinite(const NonFinite& n);
  void EmitSummary(const Report& report);
  std::string Text() const { return out_.str(); }

 private:
  std::ostream& Arrow();
  std::ostream& Fact();
  std::ostream& Note();
  bool EmitSourceQuote(const OpRef& op, const std::string& label);
  void EmitHeading(const Violation& v);
  void EmitCulprit(const Violation& v);
  void EmitUnrecordedWrite(const Violation& v);
  void EmitCandidates(const Violation& v);
  void EmitVictim(const Violation& v);
  void EmitLibraryFrame(const OpRef& op);
  void EmitFunctionContext(const OpRef& op);
  void EmitNeededBy(const Violation& v);
  void EmitGroup(const ViolationGroup& group);
  void EmitMessage(const std::string& lead, const std::string& message);
  void EmitVersions(const Violation& v);
  void EmitCounterReset(const Violation& v);
  void EmitTensor(const Violation& v);
  void EmitFingerprint(const Violation& v);
  void EmitPytorch(const Violation& v);
  void EmitLaterCulprits(const Violation& v);
  void EmitHelp(const Violation& v);
  void EmitIncomplete(const Violation& v);

  Painter p_;
  SourceCache sources_;
  std::set<std::string> said_differs_;  // Files said to differ here from the recorded ones.
  std::set<std::string> said_not_read_;  // Files not read here (IsLocalSource), said once.
  std::ostringstream out_;
};

// The prefixes of a location line, a fact line and a note line (the caller writes the rest):
//     --> train.py:12 in forward
//      = saved at version 0, used at version 1
//   note: saved here by aten::sigmoid at train.py:11 in forward
std::ostream& TextReport::Arrow() { return out_ << "  " << p_.Gutter("-->") << " "; }
std::ostream& TextReport::Fact() { return out_ << "   " << p_.Gutter("=") << " "; }
std::ostream& TextReport::Note() { return out_ << p_.Note("note") << ": "; }

// First of all, when the recorder stopped early:
//   warning: incomplete recording: the recorder stopped in op #41: internal error at the end of
//   aten::add: ...; what ran after it was not recorded, and a violation there is not reported
void TextReport::EmitRecordingStop(const RecordingStop& stop) {
  out_ << p_.Warning("warning") << ": incomplete recording: the recorder stopped"
       << (stop.op != 0 ? " in op #" + std::to_string(stop.op) : std::string()) << ": "
       << Printable(stop.message)
       << "; what ran after it was not recorded, and a violation there is not reported\n";
}

//   warning: the recorder lost 7 records (1 data-loss records): culprits may be missing
void TextReport::EmitWarning(const std::string& warning) {
  out_ << p_.Warning("warning") << ": " << Printable(warning) << "\n";
}

// One diagnostic, section by section, and a blank line after it; with `group`, for all the
// violations of the group.
void TextReport::EmitViolation(const Violation& v, const ViolationGroup* group) {
  EmitHeading(v);
  if (v.culprit) {
    EmitCulprit(v);
  } else {
    EmitUnrecordedWrite(v);
  }
  EmitChangedSource(v);
  EmitVictim(v);
  EmitNeededBy(v);
  if (group != nullptr) EmitGroup(*group);
  EmitVersions(v);
  EmitCounterReset(v);
  EmitTensor(v);
  EmitFingerprint(v);
  EmitPytorch(v);
  EmitLaterCulprits(v);
  EmitIncomplete(v);
  EmitHelp(v);
  out_ << "\n";
}

// For a diagnostic that stands for several violations:
//      = 40 times: steps 0-19; first at step 0 (--all prints each)
void TextReport::EmitGroup(const ViolationGroup& group) {
  Fact() << p_.Bold(TimesAndSteps(group)) << " (--all prints each)\n";
}

//    = recording incomplete: a write or use it missed could change this verdict
void TextReport::EmitIncomplete(const Violation& v) {
  if (!v.recording_incomplete) return;
  Fact() << "recording incomplete: a write or use it missed could change this verdict\n";
}

// A backward function that threw with no violation to explain it:
//   error: backward raised an error that torchrr does not explain
//     --> MulBackward0 (backward op #12)
//      = pytorch: this backward always fails
void TextReport::EmitUnexplainedError(const UnexplainedError& error) {
  out_ << p_.Error("error") << ": "
       << p_.Bold("backward raised an error that torchrr does not explain") << "\n";
  Arrow() << Printable(error.backward_op.name) << " (backward op #" << error.backward_op.id
          << ")\n";
  if (!error.message.empty()) Fact() << "pytorch: " << Printable(error.message) << "\n";
  out_ << "\n";
}

// The program's own error, not about saved tensors:
//   error: the program raised an error that torchrr does not explain
//     --> train.py:12 in forward
//      |
//   12 |     residual += attn_out
//      |     ^^^^^^^^^^^^^^^^^^^^ aten::add_.Tensor raised it
//      = RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
//      = torchrr follows what autograd saved for backward: this error is of another kind
void TextReport::EmitProgramError(const ProgramError& error) {
  out_ << p_.Error("error") << ": "
       << p_.Bold("the program raised an error that torchrr does not explain") << "\n";
  if (error.op.id != 0) {
    Arrow() << Location(error.op) << "\n";
    std::string label = OpName(error.op) + " raised it";
    if (!EmitSourceQuote(error.op, label)) Fact() << "raised by " << label << "\n";
  } else {
    Arrow() << "<no recorded op raised it>\n";
  }
  EmitMessage(Printable(error.type.empty() ? std::string("error") : error.type) + ": ",
              error.message);
  Fact() << "torchrr follows what autograd saved for backward: this error is of another kind\n";
  out_ << "\n";
}

// Where the gradient stopped (GradientCut):
//   error: backward raised: the path from trainable parameters to the loss was cut here
//     --> train.py:12 in forward
//      |
//   12 |     h = self.encoder(x)
//      |     ^^^^^^^^^^^^^^^^^^^ aten::linear ran under torch.no_grad(): no gradient past it
//      = 2 encoder in layers 0-1 that require grad (encoder.0.weight, encoder.0.bias, ...)
//   note: the loss: aten::mean at train.py:14 in <module>
//      = pytorch: element 0 of tensors does not require grad and does not have a grad_fn
//   help: this op ran under torch.no_grad() ...
void TextReport::EmitGradientCut(const GradientCut& cut) {
  const std::string count = std::to_string(cut.parameter_count);
  out_ << p_.Error("error") << ": "
       << p_.Bold(cut.raised ? "backward raised: the path from trainable parameters to the loss "
                               "was cut"
                             : count + " trainable parameter" +
                                   (cut.parameter_count == 1 ? "" : "s") +
                                   " got no gradient: backward never reached " +
                                   (cut.parameter_count == 1 ? "it" : "them"))
       << "\n";
  static constexpr const char* kWhat[] = {
      "ran under torch.no_grad(): no gradient past it",
      "ran under torch.inference_mode(): no gradient past it",
      "detached it: no gradient past it",
      "made it a Python number: a tensor made from it has no history",
      "detached it for NumPy (or a raw pointer): what came back has no history",
      "ran under no_grad inside checkpoint(use_reentrant=True), whose inputs do not require grad",
      "made an output with no autograd node from an input that requires grad",
      "",
  };
  const OpRef* at = cut.checkpoint ? &*cut.checkpoint : cut.op ? &*cut.op : nullptr;
  if (at != nullptr) {
    Arrow() << Location(*at) << "\n";
    std::string label = cut.checkpoint
                            ? OpName(*cut.checkpoint) +
                                  ": checkpoint(use_reentrant=True) with no input that requires "
                                  "grad, its output has no grad_fn"
                            : OpName(*at) + " " + kWhat[static_cast<int>(cut.cause)];
    if (!EmitSourceQuote(*at, label)) Fact() << label << "\n";
    if (std::string library = LibraryLocation(*at); !library.empty()) {
      Fact() << "run by " << Printable(library) << "\n";
    }
    if (cut.checkpoint && cut.op) {
      Note() << OpName(*cut.op) << " ran under its no_grad at " << Location(*cut.op)
             << (cut.op->module.empty() ? "" : " in " + Printable(cut.op->module)) << "\n";
    } else if (!at->module.empty()) {
      Fact() << "in " << Printable(at->module) << "\n";
    }
  } else {
    Arrow() << "<no recorded op connects the loss to a parameter that requires grad>\n";
  }
  if (cut.parameter_count != 0) {
    std::string names;
    for (size_t i = 0; i < cut.parameters.size() && i < 3; ++i) {
      const std::string& name = cut.parameters[i].name;
      names += (i ? ", " : "") + (name.empty() ? "#" + std::to_string(cut.parameters[i].id)
                                               : Printable(name));
    }
    if (cut.parameter_count > 3) names += ", ...";
    Fact() << (cut.raised ? "cut off: " : "no gradient: ") << Printable(cut.summary) << " ("
           << names << ")\n";
  }
  if (cut.backward_passes != 0) {
    Fact() << "in " << cut.backward_passes << " backward pass"
           << (cut.backward_passes == 1 ? "" : "es")
           << " that ran: their AccumulateGrad never ran, their .grad stays None\n";
  }
  if (cut.loss) Note() << "the loss: " << OpName(*cut.loss) << " at " << Location(*cut.loss) << "\n";
  if (!cut.pytorch_message.empty()) EmitMessage("pytorch: ", cut.pytorch_message);
  out_ << p_.Help("help") << ": " << Printable(cut.help) << "\n\n";
}

// Two significant digits: "7.1e+04", "0.5".
std::string Magnitude(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2g", value);
  return text;
}

// A dtype's largest value as its documentation gives it: "65504", "3.40282e+38".
std::string DTypeLimit(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// The first NaN or Inf (NonFinite):
//   error: the first NaN reached a gradient: aten::log made it from finite inputs, step 2
//     --> train.py:12 in forward
//      |
//   12 |     y = torch.log(x)
//      |         ^^^^^^^^^^^^ aten::log made a NaN (float32)
//      = in encoder.0 (Linear)
//      = 14 later ops carried it on, in 1 step
//   help: keep the argument in the function's domain: ...
void TextReport::EmitNonFinite(const NonFinite& n) {
  const std::string what = n.nan ? "NaN" : "Inf";
  const std::string a_what = n.nan ? "a NaN" : "an Inf";
  const std::string maker = n.backward && n.forward
                                ? n.op.name + " (the backward of " + OpName(*n.forward) + ")"
                                : OpName(n.op);
  std::string step = n.step == UINT64_MAX ? "" : ", step " + std::to_string(n.step);
  out_ << p_.Error("error") << ": "
       << p_.Bold(n.cause == NonFiniteCause::kData
                      ? a_what + " came in with the data and reached " + n.reached
                      : "the first " + what + " reached " + n.reached + ": " + maker +
                            (n.cause == NonFiniteCause::kMaskedRow
                                 ? " made it from a row of -inf"
                                 : " made it from finite inputs") +
                            step)
       << "\n";
  const OpRef& at = n.backward && n.forward ? *n.forward : n.op;
  if (at.id != 0) {
    Arrow() << Location(at) << "\n";
    std::string label;
    switch (n.cause) {
      case NonFiniteCause::kData:
        label = OpName(at) + " read a tensor that already held " + a_what;
        break;
      case NonFiniteCause::kWhereTrap:
        label = "in backward, " + n.op.name + " made " + a_what +
                " for the branch torch.where did not take";
        break;
      default:
        label = (n.backward ? "in backward, " + n.op.name : OpName(at)) + " made " + a_what +
                (n.dtype.empty() ? "" : " (" + n.dtype + ")");
    }
    if (!EmitSourceQuote(at, label)) Fact() << label << "\n";
    if (std::string library = LibraryLocation(at); !library.empty()) {
      Fact() << "run by " << Printable(library) << "\n";
    }
    if (!at.module.empty()) Fact() << "in " << Printable(at.module) << "\n";
  } else {
    Arrow() << "<the op that read it was not recorded>\n";
  }
  if (n.cause == NonFiniteCause::kOverflow && n.dtype_max > 0) {
    Fact() << n.dtype << " overflows past " << DTypeLimit(n.dtype_max)
           << "; the inputs' largest magnitude was " << Magnitude(n.input_max_abs) << "\n";
  } else if (n.cause == NonFiniteCause::kMaskedRow) {
    Fact() << "a row of its input had no finite score (every position masked to -inf)\n";
  }
  if (n.became_nan) {
    Note() << "the Inf became a NaN at " << OpName(*n.became_nan) << " at "
           << Location(*n.became_nan) << "\n";
  }
  if (n.later_ops != 0 || n.steps > 1) {
    Fact() << n.later_ops << " later op" << (n.later_ops == 1 ? "" : "s")
           << " carried it on, in " << n.steps << " step" << (n.steps == 1 ? "" : "s") << "\n";
  }
  out_ << p_.Help("help") << ": " << Printable(n.help) << "\n\n";
}

// A message of several lines (torch.compile's errors name the frame and the user code on lines of
// their own) as fact lines, each escaped on its own so that none can pass for a diagnostic:
//      = torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped
//      =   Explanation: ...
// At most kMaxMessageLines lines, then how many more there were.
void TextReport::EmitMessage(const std::string& lead, const std::string& message) {
  constexpr size_t kMaxMessageLines = 24;
  size_t shown = 0, at = 0;
  while (at <= message.size()) {
    size_t end = message.find('\n', at);
    if (end == std::string::npos) end = message.size();
    const std::string line = message.substr(at, end - at);
    at = end + 1;
    if (shown != 0 && line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (shown == kMaxMessageLines) {
      size_t more = 1;
      for (size_t i = at; i < message.size(); ++i) more += message[i] == '\n';
      Fact() << "  (" << more << " more lines)\n";
      return;
    }
    if (shown == 0) {
      Fact() << lead << Printable(line) << "\n";
    } else {
      Fact() << "  " << Printable(line) << "\n";
    }
    ++shown;
    if (end == message.size()) break;
  }
}

// The last line, with what was looked at:
//   1 violation (3 ops, 1 node executions in 1 backward pass)
//   no saved tensor was modified (3 ops, 1 node executions in 1 backward pass)
//   no saved tensor was modified in the recorded part, but the recording is incomplete (...)
void TextReport::EmitSummary(const Report& report) {
  std::string counts = std::to_string(report.ops) + " ops, " +
                       std::to_string(report.node_executions) + " node executions in " +
                       std::to_string(report.backward_passes) + " backward pass" +
                       (report.backward_passes == 1 ? "" : "es") +
                       (report.compile_passes == 0
                            ? std::string()
                            : " and " + std::to_string(report.compile_passes) +
                                  " torch.compile ran to trace its regions");
  if (report.restored_count != 0) {
    // Writes that are not violations but that a reader of the trace may wonder about.
    counts += "; " + std::to_string(report.restored_count) + " write" +
              (report.restored_count == 1 ? "" : "s") +
              " under a preserved version counter put back the saved values, as FSDP2's "
              "all-gather does (--json: restored_writes)";
  }
  if (report.scaler_skipped_steps != 0) {
    counts += "; a GradScaler skipped " + std::to_string(report.scaler_skipped_steps) + " step" +
              (report.scaler_skipped_steps == 1 ? "" : "s") +
              " whose gradients were not finite, as it does while its scale settles";
  }
  if (report.window()) {
    counts += "; steps " + std::to_string(report.first_step) + " to " +
              std::to_string(report.last_step) + " of the run, the earlier ones not kept";
  }
  if (report.violations.empty() && report.ops == 0 && !report.incomplete()) {
    // Nothing was recorded: no verdict, however clean the trace reads, whatever error it kept.
    out_ << "no op was recorded: this trace says nothing of the run (a --steps range it never "
            "reached, or a recording that ended before its first op) (" << counts << ")\n";
  } else if (report.violations.empty() && !report.unexplained_errors.empty()) {
    size_t n = report.unexplained_errors.size();
    out_ << "no saved tensor was modified, but backward raised " << n << " error"
         << (n == 1 ? "" : "s") << " that torchrr does not explain (" << counts << ")\n";
  } else if (report.violations.empty() && !report.gradient_cuts.empty()) {
    size_t n = report.gradient_cuts.size();
    out_ << p_.Bold("the gradient stopped at " + std::to_string(n) + " place" +
                    (n == 1 ? "" : "s"))
         << "; no saved tensor was modified (" << counts << ")\n";
  } else if (report.violations.empty() && report.non_finite) {
    out_ << p_.Bold(std::string(report.non_finite->nan ? "a NaN" : "an Inf") + " reached " +
                    report.non_finite->reached)
         << "; no saved tensor was modified (" << counts << ")\n";
  } else if (report.program_error) {
    out_ << "no saved tensor was modified, but the program raised an error that torchrr does not "
            "explain (" << counts << ")\n";
  } else if (report.violations.empty() && report.window() && !report.incomplete()) {
    out_ << "no saved tensor was modified in the kept steps, but the steps before them were not "
            "kept (" << counts << ")\n";
  } else if (report.violations.empty() && report.incomplete()) {
    out_ << "no saved tensor was modified in the recorded part, but the recording is incomplete ("
         << counts << ")\n";
  } else if (report.violations.empty()) {
    out_ << "no saved tensor was modified (" << counts << ")\n";
  } else {
    size_t n = report.violations.size();
    std::string places;
    if (!report.groups.empty() && report.groups.size() < n) {
      places = " at " + std::to_string(report.groups.size()) + " place" +
               (report.groups.size() == 1 ? "" : "s");
    }
    out_ << p_.Bold(std::to_string(n) + " violation" + (n == 1 ? "" : "s") + places) << " ("
         << counts << ")\n";
  }
}

// Quotes the op's user line, indentation dropped, the statement (not a trailing comment)
// underlined with `label` after it, from the trace or else
// this machine's file (SourceCache); writes nothing and returns false when neither has it. The
// first quote from a file that differs here from the recorded one says so:
//      |
//   12 |     y.mul_(2)
//      |     ^^^^^^^^^ aten::mul_ changed the version 0 -> 1
//      = train.py on this machine differs from the file the run used: the code shown is the run's
bool TextReport::EmitSourceQuote(const OpRef& op, const std::string& label) {
  if (!op.user_frame) return false;
  SourceOrigin origin;
  const std::string* line = sources_.Line(op.user_frame->file, op.user_frame->line, &origin);
  if (line == nullptr) {
    if (origin == SourceOrigin::kNotLocalSource &&
        said_not_read_.insert(op.user_frame->file).second) {
      Fact() << Printable(op.user_frame->file)
             << " is not quoted: the trace carries none of its code, and this machine's files are "
                "read only for source files under the working directory (or --source-root DIR)\n";
    }
    return false;
  }
  std::string number = std::to_string(op.user_frame->line);
  std::string pad(number.size(), ' ');
  const std::string code = Unindented(*line);
  out_ << pad << " " << p_.Gutter("|") << "\n";
  out_ << p_.Gutter(number + " |") << "     " << code << "\n";
  out_ << pad << " " << p_.Gutter("|") << "     "
       << p_.Bold(std::string(StatementWidth(code, op.user_frame->file), '^')) << " " << label
       << "\n";
  if (origin == SourceOrigin::kTraceDiffers && said_differs_.insert(op.user_frame->file).second) {
    Fact() << Printable(op.user_frame->file)
           << " on this machine differs from the file the run used: the code shown is the run's\n";
  }
  return true;
}

//   error: saved tensor modified in place
//   error: saved tensor's memory overwritten without a version bump (PyTorch cannot detect this)
//   error: saved tensor modified in place where PyTorch does not check (the gradient used the
//   modified value)
//   error: saved tensor overwritten, its version counter set back (PyTorch cannot detect this)
//   error: saved tensor detached in place
//   error: saved tensor used after an earlier backward pass freed it
//   error: backward failed on a saved tensor returned by a saved_tensors_hooks unpack hook
//   error: a saved_tensors_hooks unpack hook handed backward another tensor than was saved ...
void TextReport::EmitHeading(const Violation& v) {
  const char* heading = ": saved tensor modified in place";
  switch (v.kind) {
    case ViolationKind::kSilent:
      heading = v.evidence == SilentEvidence::kUnpackHook
                    ? ": a saved_tensors_hooks unpack hook handed backward another tensor than "
                      "was saved (PyTorch does not check it: the gradient is silently wrong)"
                : v.evidence == SilentEvidence::kStorageSwap
                    ? ": saved tensor's storage replaced by `.data =` before backward used it "
                      "(PyTorch cannot detect this)"
                : v.evidence == SilentEvidence::kUncheckedSave
                    ? ": saved tensor modified in place where PyTorch does not check (the "
                      "gradient used the modified value)"
                : v.evidence == SilentEvidence::kCounterReset
                    ? ": saved tensor overwritten, its version counter set back (PyTorch cannot "
                      "detect this)"
                    : ": saved tensor's memory overwritten without a version bump (PyTorch "
                      "cannot detect this)";
      break;
    case ViolationKind::kDetached: heading = ": saved tensor detached in place"; break;
    case ViolationKind::kFreed:
      heading = ": saved tensor used after an earlier backward pass freed it";
      break;
    case ViolationKind::kUnpackHook:
      heading = ": backward failed on a saved tensor returned by a saved_tensors_hooks unpack hook";
      break;
    case ViolationKind::kCachedMutated:
      heading = ": an output selective activation checkpointing cached was modified in place";
      break;
    default: break;
  }
  out_ << p_.Error("error") << p_.Bold(heading) << "\n";
}

// Where the culprit was called and what it did, its line quoted when readable here (else a
// "culprit:" fact), then, for a write found by fingerprint, the other candidates:
//     --> train.py:12 in forward
//      |
//   12 |     y.mul_(2)
//      |     ^^^^^^^^^ aten::mul_ changed the version 0 -> 1
//     --> train.py:14 in forward
//      = culprit: aten::mul_ wrote into its memory through another tensor, ...
void TextReport::EmitCulprit(const Violation& v) {
  Arrow() << Location(*v.culprit) << "\n";
  std::string label = CulpritLabel(v);
  if (!EmitSourceQuote(*v.culprit, label)) Fact() << "culprit: " << label << "\n";
  EmitFunctionContext(*v.culprit);
  EmitLibraryFrame(*v.culprit);
  if (v.evidence == SilentEvidence::kFingerprint) EmitCandidates(v);
}

// No recorded op is known to have done it. Freed, or handed back by an unpack hook:
//     --> <no earlier execution of the node was recorded>
//     --> <the unpack hook is not an op: the trace does not show what it returned>
// Found by the version counter:
//     --> <the write was not recorded: the version counter moved between two recorded uses>
// Found by fingerprints, then the candidates, or, when there are none, where the write came from:
//     --> <no version counter saw the write: the saved bytes changed between the save and ...>
//      = no recorded op or kernel touched those bytes in between: the write came from ...
void TextReport::EmitUnrecordedWrite(const Violation& v) {
  if (v.kind == ViolationKind::kFreed) {
    Arrow() << "<no earlier execution of the node was recorded>\n";
    return;
  }
  if (v.kind == ViolationKind::kUnpackHook) {
    Arrow() << "<the unpack hook is not an op: the trace does not show what it returned>\n";
    return;
  }
  if (v.evidence != SilentEvidence::kFingerprint) {
    Arrow() << "<the write was not recorded: the version counter moved between two recorded "
               "uses>\n";
    return;
  }
  Arrow() << "<no version counter saw the write: the saved bytes changed between the save and "
             "the use (fingerprints)>\n";
  if (v.candidates.empty() && v.kernels.empty()) {
    Fact() << "no recorded op or kernel touched those bytes in between: the write came from "
              "outside PyTorch's ops (numpy, a raw pointer, a C extension)\n";
  }
  EmitCandidates(v);
}

// For a silent write found by fingerprint: the ops that wrote into or made a tensor over the saved
// bytes (but the culprit, already shown), grouped by call site with one quote each, and the CUDA
// work launched outside any op in between:
//   note: candidate: aten::detach, aten::numpy made a tensor over them at train.py:13 in forward
//   note: candidate: scribble_kernel on cuda:0, launched outside any op
void TextReport::EmitCandidates(const Violation& v) {
  std::vector<const SilentCandidate*> shown;
  for (const SilentCandidate& c : v.candidates) {
    if (!(v.culprit && c.op.id == v.culprit->id)) shown.push_back(&c);
  }
  for (size_t i = 0; i < shown.size();) {
    size_t j = i + 1;
    while (j < shown.size() && Location(shown[j]->op) == Location(shown[i]->op)) ++j;
    std::string names;
    bool wrote = false;
    for (size_t k = i; k < j; ++k) {
      names += (k > i ? ", " : "") + OpName(shown[k]->op);
      wrote |= shown[k]->wrote;
    }
    std::string label = names + (wrote ? " wrote into them" : " made a tensor over them");
    Note() << "candidate: " << label << " at " << Location(shown[i]->op) << "\n";
    EmitSourceQuote(shown[i]->op, label);
    i = j;
  }
  for (const KernelRef& k : v.kernels) {
    Note() << "candidate: " << Printable(k.name) << " on cuda:" << k.device
           << ", launched outside any op\n";
  }
}

// Where the values the culprit wrote back came from, when a parameter they come from was written
// after the save (an optimizer step between forward and backward under FSDP2):
//   note: the values it wrote back come from a parameter written after the save, by aten::add_
//         at train.py:69 in train
//      |
//   69 |     opt.step()
//      |     ^^^^^^^^^^ wrote the parameter
void TextReport::EmitChangedSource(const Violation& v) {
  if (!v.changed_source) return;
  Note() << "the values it wrote back come from a parameter written after the save, by "
         << OpName(*v.changed_source) << " at " << Location(*v.changed_source) << "\n";
  EmitSourceQuote(*v.changed_source, "wrote the parameter");
}

// The op that saved the tensor (the victim), its line quoted when readable here:
//   note: saved here by aten::sigmoid at train.py:11 in forward
//      |
//   11 |     y = torch.sigmoid(x)
//      |     ^^^^^^^^^^^^^^^^^^^^ saved by aten::sigmoid
//   note: the op that saved it was not recorded
void TextReport::EmitVictim(const Violation& v) {
  if (!v.victim) {
    Note() << "the op that saved it was not recorded\n";
    return;
  }
  Note() << "saved here by " << OpName(*v.victim) << " at " << Location(*v.victim) << "\n";
  EmitSourceQuote(*v.victim, "saved by " + OpName(*v.victim));
  EmitFunctionContext(*v.victim);
  EmitLibraryFrame(*v.victim);
}

// An op a Python autograd.Function's own code ran, and the program's line that ran the Function:
//      = in XEntropy's forward, called from train.py:102
//      = in Scratch's backward, run by the backward() at train.py:120
void TextReport::EmitFunctionContext(const OpRef& op) {
  if (op.function.empty()) return;
  Fact() << "in " << Printable(op.function) << (op.in_function_backward ? "'s backward" : "'s forward");
  if (op.called_from) {
    out_ << (op.in_function_backward ? ", run by the backward() at " : ", called from ")
         << Printable(op.called_from->file) << ":" << op.called_from->line;
  }
  out_ << "\n";
}

// The library code that ran an op the quoted line only called:
//      = run inside transformers/activations.py:84 in SiLUActivation.forward
void TextReport::EmitLibraryFrame(const OpRef& op) {
  const std::string library = LibraryLocation(op);
  if (!library.empty()) Fact() << "run inside " << library << "\n";
}

// The node that needed the tensor, and which of its saved members it was:
//      = needed by SigmoidBackward0 (saved `result`, an output of its op)
//      = needed by CatBackward0 (saved `tensors[1]`, an input of its op), in the part of the ...
void TextReport::EmitNeededBy(const Violation& v) {
  if (v.kind == ViolationKind::kCachedMutated) {
    Fact() << "cached in forward (selective activation checkpointing) for the recomputation of "
              "what " << p_.Bold(Printable(v.backward_node.name)) << " saved\n";
    return;
  }
  // A damaged or hostile trace may leave the node or the member without a name.
  std::string member = v.read_by_recompute ? std::string("not saved: read by the checkpointed block")
                       : v.tensor.saved_name.empty()
                           ? std::string("a saved tensor the trace does not name")
                           : (IsCtxAttribute(v) ? "kept on its ctx as `" : "saved `") +
                                 Printable(v.tensor.saved_name);
  if (v.tensor.list_index != format::TensorUse::kNotInList) {
    member += "[" + std::to_string(v.tensor.list_index) + "]";
  }
  if (!v.tensor.saved_name.empty() && !v.read_by_recompute) member += "`";
  const std::string node = v.backward_node.name.empty()
                               ? "a node the trace does not name (#" +
                                     std::to_string(v.backward_node.id) + ")"
                               : Printable(v.backward_node.name);
  Fact() << "needed by " << p_.Bold(node) << " (" << member
         << (v.read_by_recompute ? " in forward"
                                 : v.tensor.is_output ? ", an output of its op" : ", an input of its op")
         << ")"
         << (v.simulated ? ", in the part of the backward pass that did not run" : "")
         << (v.step ? ", in step " + std::to_string(*v.step) : std::string()) << "\n";
  if (v.recomputing) {
    Fact() << "activation checkpointing: backward read it to recompute what "
           << Printable(v.recomputing->name) << " saved\n";
  }
  if (v.evidence == SilentEvidence::kUncheckedSave && v.recomputed) {
    Fact() << "activation checkpointing recomputed it in backward; it was written between the "
              "forward and its use, and PyTorch does not check recomputed tensors\n";
  } else if (v.evidence == SilentEvidence::kAliasedWrite &&
             v.backward_node.name == "CompiledFunctionBackward") {
    Fact() << "torch.compile saved it as another tensor over the same memory, with a version "
              "counter of its own: PyTorch's check does not see writes through the tensor the "
              "program holds\n";
  } else if (v.evidence == SilentEvidence::kAliasedWrite && v.recomputed) {
    Fact() << "activation checkpointing recomputed it in backward, and the write came after, as "
              "in the forward: backward used the bytes it left\n";
  } else if (v.read_by_recompute) {
    Fact() << "activation checkpointing (use_reentrant=True) ran the block again in backward, "
              "reading this tensor as it was then, not as forward read it: PyTorch checks only "
              "the block's inputs\n";
  } else if (IsCtxStash(v)) {
    Fact() << "the Function's backward read it from its ctx, which PyTorch does not check: only "
              "what ctx.save_for_backward saved is version-checked\n";
  } else if (v.evidence == SilentEvidence::kUncheckedSave) {
    Fact() << "backward used it without PyTorch's version check (a saved-tensor hook packed the "
              "tensor itself, or torch.compile saved it without a check)\n";
  } else if (v.evidence == SilentEvidence::kAliasedWrite && v.tensor.inner != 0) {
    Fact() << "it is a wrapper subclass (a DTensor): the write went through the tensor it wraps "
              "(its shard, to_local()), whose version counter is not its own\n";
  }
}

//      = saved at version 0, used at version 1
//      = saved at version 0, would be used at version 1
// Only for violations about versions (version, silent).
void TextReport::EmitVersions(const Violation& v) {
  if (v.kind != ViolationKind::kVersion && v.kind != ViolationKind::kSilent) return;
  Fact() << "saved at version " << v.saved_version << ", "
         << (v.simulated ? "would be used" : "used") << " at version " << v.current_version
         << "\n";
}

// A counter set back, and the two recorded ops between which it went back:
//      = its version counter went back from 1 to 0 between aten::mul_ at train.py:5 in <module>
//        and aten::sum at train.py:6 in <module> (torch.autograd._unsafe_preserve_version_cou...
void TextReport::EmitCounterReset(const Violation& v) {
  if (!v.counter_reset) return;
  const CounterReset& reset = *v.counter_reset;
  Fact() << "its version counter went back from " << reset.from << " to " << reset.to
         << " between " << OpName(reset.before) << " at " << Location(reset.before) << " and "
         << OpName(reset.after) << " at " << Location(reset.after)
         << " (torch.autograd._unsafe_preserve_version_counter, or _unsafe_set_version_counter)\n";
}

//      = tensor: float32[4, 8] on cpu (tensor #5), which PyTorch calls "output 0 of SigmoidBa...
//      = tensor: metadata not recorded
void TextReport::EmitTensor(const Violation& v) {
  Fact() << "tensor: ";
  if (!v.tensor.dtype.empty()) {
    out_ << Printable(v.tensor.dtype) << Shape(v.tensor.shape) << " on "
         << Printable(v.tensor.device);
  } else {
    out_ << "metadata not recorded";
  }
  if (v.tensor.id != 0) out_ << " (tensor #" << v.tensor.id << ")";
  if (v.pytorch_names) out_ << ", which PyTorch calls \"" << Printable(*v.pytorch_names) << "\"";
  out_ << "\n";
  if (v.unpacked) {
    Fact() << "unpacked: the hook returned " << Printable(v.unpacked->dtype)
           << Shape(v.unpacked->shape) << " where " << Printable(v.unpacked->saved_dtype)
           << Shape(v.unpacked->saved_shape) << " was saved\n";
  }
}

// Only when the fingerprints were recorded and differ:
//      = fingerprint of its bytes: 0000000000001111 at save, 0000000000002222 at use
void TextReport::EmitFingerprint(const Violation& v) {
  if (!v.fingerprint) return;
  char hashes[80];
  std::snprintf(hashes, sizeof(hashes), "%016llx at save, %016llx at use",
                static_cast<unsigned long long>(v.fingerprint->at_save),
                static_cast<unsigned long long>(v.fingerprint->at_use));
  Fact() << "fingerprint of its bytes: " << hashes << "\n";
}

// What PyTorch did: raised (with its message, cut before its hint), or why it did not:
//      = pytorch: raised: one of the variables needed for gradient computation has been modif...
//      = pytorch: no error: the write bypassed the version counter, so gradients are silently ...
//      = pytorch: no error: it does not check this saved tensor, so gradients are silently wrong
//      = pytorch: did not get here (an earlier node threw); it raises once that one is fixed
//      = pytorch: did not raise here
void TextReport::EmitPytorch(const Violation& v) {
  Fact() << "pytorch: ";
  if (v.pytorch_raised) {
    out_ << "raised";
    if (v.pytorch_message) {
      std::string message = *v.pytorch_message;
      if (size_t cut = message.find(" Hint:"); cut != std::string::npos) message.resize(cut);
      out_ << ": " << Printable(message);
    }
  } else if (v.read_by_recompute) {
    out_ << "no error: it checks only the block's inputs, so gradients are silently wrong";
  } else if (IsCtxStash(v)) {
    out_ << "no error: it does not check ctx attributes, so gradients are silently wrong";
  } else if (v.evidence == SilentEvidence::kUncheckedSave) {
    out_ << "no error: it does not check this saved tensor, so gradients are silently wrong";
  } else if (v.evidence == SilentEvidence::kUnpackHook) {
    out_ << "no error: it checks nothing of what unpack hooks return, and casts each gradient "
            "back to its input's dtype, so gradients are silently wrong";
  } else if (v.evidence == SilentEvidence::kStorageSwap) {
    out_ << "no error: `.data =` moves no version counter, so gradients are silently wrong";
  } else if (v.kind == ViolationKind::kSilent && v.evidence == SilentEvidence::kCounterReset) {
    out_ << "no error: the counter was set back, so its check passed and gradients are silently "
            "wrong";
  } else if (v.kind == ViolationKind::kSilent) {
    out_ << "no error: the write bypassed the version counter, so gradients are silently wrong";
  } else if (v.simulated) {
    out_ << "did not get here (an earlier node threw); it raises once that one is fixed";
  } else {
    out_ << "did not raise here";
  }
  out_ << "\n";
}

//   note: modified again later by aten::add_ at train.py:13 in forward
void TextReport::EmitLaterCulprits(const Violation& v) {
  for (const OpRef& later : v.later_culprits) {
    Note() << "modified again later by " << OpName(later) << " at " << Location(later) << "\n";
  }
}

// The fix, by kind:
//   help: make aten::mul_ out of place (aten::mul), or .clone() the tensor before modifying it
//   help: use out-of-place .detach(), which returns a new tensor and leaves the saved one in ...
//   help: pass retain_graph=True to the earlier backward() to run backward through this graph ...
//   help: write through the tensor itself, not .data or another tensor over its memory ...
//   help: find what writes into this memory between the two points (a raw kernel, numpy, an ...
void TextReport::EmitHelp(const Violation& v) {
  out_ << p_.Help("help") << ": " << FixHint(v) << "\n";
}

}  // namespace

std::string FormatText(const Report& report, bool color, bool each) {
  TextReport text(color, report);
  // A trace with no op says so first: what it kept (the program's error) is no verdict.
  const bool empty = report.violations.empty() && report.ops == 0 && !report.incomplete();
  if (empty && (!report.warnings.empty() || report.program_error)) text.EmitSummary(report);
  if (report.recording_stopped) text.EmitRecordingStop(*report.recording_stopped);
  for (const std::string& warning : report.warnings) text.EmitWarning(warning);
  if (each || report.groups.empty()) {
    for (const Violation& v : report.violations) text.EmitViolation(v, nullptr);
  } else {
    for (const ViolationGroup& group : report.groups) {
      // Groups come from GroupViolations(report.violations); a caller's edited copy may not match.
      if (group.violations.empty() || group.violations.front() >= report.violations.size()) continue;
      text.EmitViolation(report.violations[group.violations.front()],
                         group.violations.size() > 1 ? &group : nullptr);
    }
  }
  for (const UnexplainedError& e : report.unexplained_errors) text.EmitUnexplainedError(e);
  for (const GradientCut& cut : report.gradient_cuts) text.EmitGradientCut(cut);
  if (report.non_finite) text.EmitNonFinite(*report.non_finite);
  if (report.program_error) text.EmitProgramError(*report.program_error);
  text.EmitSummary(report);
  return text.Text();
}

}  // namespace torchrr::replayer
