// GradientCutWatch: where the path from trainable parameters toward the loss lost its gradient.
//
// Backward raises "element 0 of tensors does not require grad and does not have a grad_fn" when
// the loss has no autograd history, and says nothing at all when only part of the parameters
// lost theirs (a frozen base with adapters under checkpoint(use_reentrant=True)): their
// AccumulateGrad never runs and their gradient stays None. The trace holds every op with its
// inputs and outputs, each tensor's requires_grad and grad_fn, grad mode per op, and which nodes
// ran in backward; this watch follows, op by op, which tensors carry values computed from a
// trainable parameter (a leaf that requires grad) and, for those that no longer require grad, the
// op where the gradient stopped:
//   - an op under no_grad or inference_mode (or inside a reentrant checkpoint's forward, which
//     runs under no_grad: found at Finish, once the CheckpointFunction op around it is recorded);
//   - detach(), and .item() or .numpy() (values that leave autograd and come back as a new
//     tensor, seen as the last such op on a trainable tensor before the error);
//   - an op run with grad mode on whose output has no autograd node (a kernel without backward,
//     or a buffer that a raw kernel fills).
// At the error it names the cut on the loss's path (the last forward op's output); at Finish it
// also names the parameters a backward that ran never reached because a reentrant checkpoint cut
// them off. Parameters used deliberately under a user's no_grad (a teacher, an EMA copy) are not
// reported when backward ran: nothing in the trace tells them from an intended freeze.
//
// Not thread-safe; reads and appends to the AnalysisState it was given (cut_findings).
#ifndef TORCHRR_REPLAYER_SRC_GRADIENT_CUT_H_
#define TORCHRR_REPLAYER_SRC_GRADIENT_CUT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis_state.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer {

// The parameters of a cut in few words: "48 lora_A/lora_B in layers 0-11": how many (`count`,
// which may exceed the ones listed), the modules they belong to (the last part of each path that
// is no index and no PEFT adapter name "default"), and the indices of the first numbered part
// ("layers.3") when they have one; "" when there are none.
std::string CutParameterSummary(const std::vector<CutParameter>& parameters, uint64_t count);
// What to change for a cut of `cause`, one sentence.
std::string CutHelp(CutCause cause);

class GradientCutWatch {
 public:
  explicit GradientCutWatch(AnalysisState& state) : state_(state) {}

  void OnString(const format::StringDef& r);
  // Every op, after the analysis recorded it (its tensors' TensorInfo came before it).
  void OnOp(const format::OpRecord& r);
  // An error of the program's: PyTorch's "does not require grad" makes a raised cut.
  void OnError(const format::ErrorRecord& r);
  // The trace ended: resolves the cuts' causes and the parameters backward never reached, into
  // AnalysisState::cut_findings. Call once, after BackwardReplay::Finish.
  void Finish();

 private:
  struct Cut {
    CutCause cause = CutCause::kNoGrad;
    format::ObjectId op = 0;
    format::ObjectId checkpoint = 0;  // Resolved at Finish.
  };
  struct Parameter {
    std::string name;
    format::InternId module = 0;
    bool named_by_argument = false;
    // The places that used it under no_grad (index + 1 in cuts_), the latest kMaxCuts distinct:
    // its initialisation, a checkpoint's forward, an optimizer's update.
    static constexpr size_t kMaxCuts = 4;
    std::vector<uint32_t> cuts;
  };
  struct RaisedError {
    std::string message;
    format::ObjectId loss_op = 0;
    format::ObjectId loss_tensor = 0;
    std::vector<std::pair<format::ObjectId, CutCause>> escapes;
  };

  bool Tainted(uint32_t slot) const { return slot < tainted_.size() && tainted_[slot] != 0; }
  uint32_t CutOf(uint32_t slot) const { return slot < cut_.size() ? cut_[slot] : 0; }
  void Set(uint32_t slot, uint32_t cut);
  uint32_t NewCut(const format::OpRecord& r, CutCause cause);
  CutCause NoGradCause(const format::OpRecord& r) const;
  void NoteParameterUse(const format::OpRecord& r, const format::TensorUse& use);
  // What tells two cuts' places apart: the op's user line (file and line of its first frame
  // that is not framework code), else its stack, else the op.
  uint64_t UserLineOf(format::ObjectId op) const;
  // Whether `tensor` (which requires grad, with metadata `t`) is the first tensor that requires
  // grad seen with its version counter, noting it when it is.
  bool OwnsCounter(const TensorState& t, format::ObjectId tensor);
  // The CheckpointFunction op `op` ran inside, 0 when none.
  format::ObjectId CheckpointAround(format::ObjectId op) const;
  std::vector<uint32_t> ParametersOf(uint32_t cut_index,
                                     const std::unordered_map<format::ObjectId, bool>& reached,
                                     std::vector<format::ObjectId>* ids) const;
  void AddFinding(CutFinding finding, const std::vector<format::ObjectId>& ids);

  AnalysisState& state_;
  // By tensor slot (AnalysisState::tensors): computed from a trainable parameter, and the cut on
  // its path when it no longer requires grad (index + 1 in cuts_).
  std::vector<uint8_t> tainted_;
  std::vector<uint32_t> cut_;
  std::vector<Cut> cuts_;
  // One cut per line and cause: (stack or op id, cause) -> index in cuts_.
  std::map<std::pair<uint64_t, uint8_t>, uint32_t> cut_by_line_;
  std::unordered_map<format::ObjectId, Parameter> parameters_;
  std::vector<format::ObjectId> parameter_order_;
  // Per thread, the latest top-level op's floating-point output that does not require grad:
  // what a backward() after it was called on.
  std::unordered_map<uint32_t, std::pair<format::ObjectId, format::ObjectId>> last_output_;
  uint32_t last_output_thread_ = 0;
  // .item() and detach() on trainable tensors since the last backward op.
  std::vector<std::pair<format::ObjectId, CutCause>> escapes_;
  std::optional<RaisedError> raised_;
  // Interned names.
  format::InternId detach_ = 0, detach_inplace_ = 0, item_ = 0, local_scalar_ = 0, tolist_ = 0,
                   checkpoint_function_ = 0;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_GRADIENT_CUT_H_
