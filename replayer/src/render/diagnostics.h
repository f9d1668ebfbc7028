// The diagnostics the editor formats print (editor_formats.h): each violation, unexplained
// backward error and program error of the reports as one line of text at one place in the user's
// code, identical ones merged. gnu_format.cc writes them as GNU lines, sarif_format.cc as SARIF
// results.
#ifndef TORCHRR_REPLAYER_SRC_RENDER_DIAGNOSTICS_H_
#define TORCHRR_REPLAYER_SRC_RENDER_DIAGNOSTICS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// A line of the user's code, as the trace names it (raw bytes, not escaped); line 0 when unknown.
struct DiagnosticPlace {
  std::string file;
  uint32_t line = 0;
  // 1-based column of the statement's first non-blank character, from the line's source (the
  // trace's copy, else this machine's); 1 when the source is not at hand.
  uint32_t column = 1;
  bool operator==(const DiagnosticPlace&) const = default;
};

// The rules a diagnostic follows, besides the violation kinds' (ViolationKindName).
inline constexpr const char kUnexplainedErrorRule[] = "unexplained_error";
inline constexpr const char kProgramErrorRule[] = "program_error";
inline constexpr const char kGradientCutRule[] = "gradient_cut";
inline constexpr const char kNonFiniteRule[] = "non_finite";

struct Diagnostic {
  // ViolationKindName(kind), kUnexplainedErrorRule, kProgramErrorRule, kGradientCutRule or
  // kNonFiniteRule.
  std::string rule;
  // The culprit's user line; without one, the victim's; nullopt when neither has a frame.
  std::optional<DiagnosticPlace> at;
  std::string message;  // One line, escaped (Printable); names no version, pass or step.
  // Violations: where the forward op that saved the tensor was called (nullopt when unknown or
  // the same as `at`), and the note said there.
  std::optional<DiagnosticPlace> victim_at;
  std::string victim_message;
  std::string node;      // The backward node that needed the tensor, escaped; "" for errors.
  std::string help;      // The fix (FixHint), escaped; "" for errors.
  std::string evidence;  // SilentEvidenceName for a silent violation; "" otherwise.
  bool pytorch_raised = false;  // PyTorch raised for one of its instances.
  // The instances merged into it: how many, from which traces (indexes into the reports given,
  // ascending) and in which backward passes (ascending, distinct; none for errors).
  size_t count = 0;
  std::vector<size_t> traces;
  std::vector<uint64_t> backward_passes;
};

// The diagnostics of `reports` (nullptr entries skipped, their index kept), in the order of
// their first instance: each report's violations as it orders them, then its unexplained errors,
// then its program error. Instances with the same rule, place, message and victim are one.
std::vector<Diagnostic> CollectDiagnostics(const std::vector<const Report*>& reports);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_RENDER_DIAGNOSTICS_H_
