#include "render/diagnostics.h"

#include <algorithm>
#include <map>
#include <string>

#include "source_files.h"
#include "text_words.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {
namespace {

// The op's user line; nullopt without a frame or a file.
std::optional<DiagnosticPlace> PlaceOf(const std::optional<OpRef>& op) {
  if (!op || !op->user_frame || op->user_frame->file.empty()) return std::nullopt;
  return DiagnosticPlace{op->user_frame->file, op->user_frame->line};
}

// "train.py:5", escaped; "train.py" without a line.
std::string PlaceText(const DiagnosticPlace& place) {
  std::string text = Printable(place.file);
  if (place.line != 0) text += ":" + std::to_string(place.line);
  return text;
}

// What happened to the saved tensor, in a few words; the text report's heading says more.
const char* Summary(const Violation& v) {
  switch (v.kind) {
    case ViolationKind::kVersion: return "saved tensor modified in place";
    case ViolationKind::kDetached: return "saved tensor detached in place";
    case ViolationKind::kFreed: return "saved tensor used after an earlier backward pass freed it";
    case ViolationKind::kUnpackHook:
      return "backward failed on the tensor an unpack hook returned for a saved one";
    case ViolationKind::kCachedMutated:
      return "output cached by selective checkpointing modified in place before recomputation";
    case ViolationKind::kSilent: break;
  }
  switch (v.evidence) {
    case SilentEvidence::kFingerprint:
      return "saved tensor's bytes changed where no version counter shows it (silently wrong "
             "gradients)";
    case SilentEvidence::kCounterReset:
      return "saved tensor overwritten and its version counter set back (silently wrong "
             "gradients)";
    case SilentEvidence::kUncheckedSave:
      return "saved tensor modified in place where PyTorch does not check (silently wrong "
             "gradients)";
    case SilentEvidence::kUnpackHook:
      return "unpack hook handed backward another tensor than was saved (silently wrong "
             "gradients)";
    case SilentEvidence::kStorageSwap:
      return "saved tensor's storage replaced before backward used it (silently wrong "
             "gradients)";
    default:
      return "saved tensor overwritten through another tensor, without a version bump "
             "(silently wrong gradients)";
  }
}

// " by aten::mul_", " by unpack hook `unpack`": who did it, with nothing that differs between
// steps (versions, passes).
std::string CulpritWords(const Violation& v) {
  if (!v.culprit) {
    return v.kind == ViolationKind::kFreed ? "" : " by a write outside any recorded op";
  }
  const OpRef& op = *v.culprit;
  if (op.hook) {
    const std::string name = op.user_frame ? Printable(op.user_frame->function) : "";
    return name.empty() ? " by an unpack hook" : " by unpack hook `" + name + "`";
  }
  if (v.kind == ViolationKind::kFreed) return " by the backward pass run here";
  if (v.evidence == SilentEvidence::kStorageSwap) return " by `.data =`";
  std::string words = " by " + OpName(op);
  if (!op.detail.empty()) words += " (through " + Printable(op.detail) + ")";
  return words;
}

std::string NodeName(const std::string& name) {
  return name.empty() ? std::string("an unnamed node") : Printable(name);
}

Diagnostic OfViolation(const Violation& v) {
  Diagnostic d;
  d.rule = ViolationKindName(v.kind);
  if (v.kind == ViolationKind::kSilent) d.evidence = SilentEvidenceName(v.evidence);
  d.node = NodeName(v.backward_node.name);
  d.help = FixHint(v);
  d.pytorch_raised = v.pytorch_raised;
  d.at = PlaceOf(v.culprit);
  std::optional<DiagnosticPlace> victim_at = PlaceOf(v.victim);
  if (!d.at) d.at = victim_at;
  d.message = std::string(Summary(v)) + CulpritWords(v) + "; ";
  if (v.victim) {
    d.message += OpName(*v.victim);
    if (victim_at) d.message += " at " + PlaceText(*victim_at);
    d.message += " saved it for " + d.node;
    d.victim_message = OpName(*v.victim) + " saved the tensor here for " + d.node;
  } else {
    d.message += "saved for " + d.node;
  }
  if (victim_at != d.at) d.victim_at = victim_at;
  return d;
}

Diagnostic OfUnexplained(const UnexplainedError& error) {
  Diagnostic d;
  d.rule = kUnexplainedErrorRule;
  d.at = PlaceOf(error.backward_op);
  d.message = "backward raised an error torchrr does not explain";
  if (!error.backward_op.name.empty()) {
    d.node = Printable(error.backward_op.name);
    d.message += ", in " + d.node;
  }
  if (!error.message.empty()) d.message += ": " + Printable(error.message);
  return d;
}

Diagnostic OfProgramError(const ProgramError& error) {
  Diagnostic d;
  d.rule = kProgramErrorRule;
  if (error.op.id != 0) d.at = PlaceOf(error.op);
  d.message = "the program raised an error torchrr does not explain: " +
              Printable(error.type.empty() ? std::string("error") : error.type);
  if (!error.message.empty()) d.message += ": " + Printable(error.message);
  if (error.op.id != 0) d.message += " (in " + OpName(error.op) + ")";
  return d;
}

// Where the gradient stopped: at the cut's line (the checkpoint call's for a reentrant
// checkpoint), else the loss's.
Diagnostic OfGradientCut(const GradientCut& cut) {
  Diagnostic d;
  d.rule = kGradientCutRule;
  d.evidence = CutCauseName(cut.cause);
  d.pytorch_raised = cut.raised;
  const std::optional<OpRef>& op = cut.checkpoint ? cut.checkpoint : cut.op;
  d.at = PlaceOf(op);
  if (!d.at) d.at = PlaceOf(cut.loss);
  d.message = cut.raised ? "the gradient stopped: backward found no path from a trainable "
                           "parameter to the loss"
                         : "the gradient stopped: trainable parameters got no gradient (" +
                               Printable(cut.summary) + ")";
  if (op) d.message += "; cut by " + OpName(*op) + " (" + CutCauseName(cut.cause) + ")";
  d.help = Printable(cut.help);
  return d;
}

// The first NaN or Inf: at the line of the op that made it (a backward node's forward op's).
Diagnostic OfNonFinite(const NonFinite& n) {
  Diagnostic d;
  d.rule = kNonFiniteRule;
  d.evidence = NonFiniteCauseName(n.cause);
  const OpRef& op = n.backward && n.forward ? *n.forward : n.op;
  if (op.id != 0) d.at = PlaceOf(std::optional<OpRef>(op));
  const std::string what = n.nan ? "NaN" : "Inf";
  d.message = n.cause == NonFiniteCause::kData
                  ? std::string(n.nan ? "a " : "an ") + what + " came in with the data and reached " + n.reached
                  : "the first " + what + " that reached " + n.reached + " was made here by " +
                        (n.backward ? Printable(n.op.name) + ", the backward of " : "") +
                        OpName(op) + " (" + NonFiniteCauseName(n.cause) + ")";
  d.help = Printable(n.help);
  return d;
}

// What makes two instances one diagnostic.
std::string KeyOf(const Diagnostic& d) {
  auto place = [](const std::optional<DiagnosticPlace>& p) {
    return p ? p->file + '\0' + std::to_string(p->line) : std::string("\1");
  };
  return d.rule + '\0' + place(d.at) + '\0' + d.message + '\0' + place(d.victim_at) + '\0' +
         d.victim_message;
}

// Sets `place`'s column to that of its line's first non-blank character (1 without the source).
void SetColumn(SourceCache& sources, std::optional<DiagnosticPlace>& place) {
  if (!place || place->line == 0) return;
  const std::string* text = sources.Line(place->file, place->line);
  if (text == nullptr) return;
  const size_t first = text->find_first_not_of(" \t\f\v");
  if (first != std::string::npos) place->column = static_cast<uint32_t>(first + 1);
}

template <typename T>
void AddSorted(std::vector<T>& values, T value) {
  auto it = std::lower_bound(values.begin(), values.end(), value);
  if (it == values.end() || *it != value) values.insert(it, value);
}

}  // namespace

std::vector<Diagnostic> CollectDiagnostics(const std::vector<const Report*>& reports) {
  std::vector<Diagnostic> diagnostics;
  std::map<std::string, size_t> index;
  const Report* current = nullptr;
  auto add = [&](Diagnostic d, size_t trace, std::optional<uint64_t> pass) {
    SourceCache sources(&current->sources);
    SetColumn(sources, d.at);
    SetColumn(sources, d.victim_at);
    auto [it, inserted] = index.try_emplace(KeyOf(d), diagnostics.size());
    if (inserted) diagnostics.push_back(std::move(d));
    Diagnostic& kept = diagnostics[it->second];
    if (!inserted) kept.pytorch_raised = kept.pytorch_raised || d.pytorch_raised;
    ++kept.count;
    AddSorted(kept.traces, trace);
    if (pass) AddSorted(kept.backward_passes, *pass);
  };
  for (size_t i = 0; i < reports.size(); ++i) {
    const Report* report = reports[i];
    if (report == nullptr) continue;
    current = report;
    for (const Violation& v : report->violations) add(OfViolation(v), i, v.backward_pass);
    for (const UnexplainedError& e : report->unexplained_errors) {
      add(OfUnexplained(e), i, std::nullopt);
    }
    for (const GradientCut& cut : report->gradient_cuts) {
      add(OfGradientCut(cut), i, std::nullopt);
    }
    if (report->non_finite) add(OfNonFinite(*report->non_finite), i, std::nullopt);
    if (report->program_error) add(OfProgramError(*report->program_error), i, std::nullopt);
  }
  return diagnostics;
}

}  // namespace torchrr::replayer
