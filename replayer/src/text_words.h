// The words the text outputs share: how an op and its place are named, what a culprit did, and
// the one-line fix for a violation. text_report.cc writes the whole report with them,
// short_verdict.cc the few lines `torchrr record` prints after the program ends. Every string from
// the trace goes through Printable.
#ifndef TORCHRR_REPLAYER_SRC_TEXT_WORDS_H_
#define TORCHRR_REPLAYER_SRC_TEXT_WORDS_H_

#include <string>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// "aten::add_.Tensor"; "an unrecorded op" when the op has no name.
std::string OpName(const OpRef& op);

// "train.py:12 in forward"; "<no user frame recorded>" without a user frame.
std::string Location(const OpRef& op);

// Where a third-party library (transformers, peft, accelerate: a package under site-packages
// other than torch) ran the op that its user frame only called (a model's forward under
// Trainer.train()): "transformers/activations.py:84 in SiLUActivation.forward", the innermost such
// frame before the user frame; "" when the user frame called torch directly, or the op has no
// Python stack.
std::string LibraryLocation(const OpRef& op);

// A quoted source line without its indentation, printable; "" for a blank line.
std::string Unindented(const std::string& line);

// How many leading characters of `code` (a line as Unindented gives it) are the statement: all
// but a trailing comment (`#` in Python, `//` in C and C++: `file`'s extension says which) and
// the blanks before it. A comment sign inside a string literal is not one. At least 1.
size_t StatementWidth(const std::string& code, const std::string& file);

// What the culprit did to the saved tensor: "aten::mul_ changed the version 0 -> 1",
// "aten::foo (wrote through aten::add_) wrote into its memory through another tensor, ...",
// "aten::detach_ detached it in place", "backward pass #0 ran SigmoidBackward0 and freed what it
// saved", "unpack hook `<lambda>` returned the tensor backward failed on". `v.culprit` is set.
std::string CulpritLabel(const Violation& v);

// The fix, by kind, in one line without its "help: ": "make aten::mul_ out of place (aten::mul),
// or .clone() the tensor before modifying it", "use out-of-place .detach(), ...".
std::string FixHint(const Violation& v);

// A violation on a tensor a Python Function's forward stashed in its ctx's attributes
// (`ctx.weight = w`), which PyTorch never checks: the saved member's name is its path on the ctx.
// IsCtxStash: one its counter shows (evidence unchecked_save).
inline bool IsCtxAttribute(const Violation& v) {
  return !v.read_by_recompute && v.tensor.saved_name.starts_with("ctx.");
}
inline bool IsCtxStash(const Violation& v) {
  return IsCtxAttribute(v) && v.evidence == SilentEvidence::kUncheckedSave;
}

// How often a group's violation happened and where: "40 times: steps 0-19; first at step 0";
// "2 times" when the trace tells no steps.
std::string TimesAndSteps(const ViolationGroup& group);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_TEXT_WORDS_H_
