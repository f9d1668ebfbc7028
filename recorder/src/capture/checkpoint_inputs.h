// The inputs non-reentrant activation checkpointing keeps, from torch 2.12 on, as a node.
//
// torch.utils.checkpoint (use_reentrant=False) keeps a checkpointed call's inputs to run the call
// again in backward, and unpacks them there with autograd's version check. Up to 2.11 an autograd
// node saved them (_NoopSaveInputsBackward, the grad_fn of frame.input_saver); from 2.12 the
// checkpoint frame holds them as standalone SavedVariables (_CheckpointFrame.saved_args, Python
// SavedTensor objects made by _CheckpointFrame.save_inputs) and no node exists. A CheckpointInputs
// stands in for that node, so that the graph capture records the inputs as a node's saved list,
// which checkpointing's placeholders name (SavedTensor.recompute_from), and the replayer checks
// them as it checks _NoopSaveInputsBackward's.
//
// It is in no graph and never runs: no edges, no sequence number (autograd's counter does not
// move), apply() returns nothing. It owns none of the SavedVariables: libtorchrr_python_nodes
// makes one per checkpoint frame, with the SavedVariables the frame holds, and clears them when
// the frame goes (under the GIL). They are read only while the frame is alive: at the end of
// save_inputs, and by the ops of the checkpointed call, whose saved placeholders keep the frame.
// Header only: libtorchrr_python_nodes makes them, the recorder recognizes them (by type name,
// as both libraries define the type).
#ifndef TORCHRR_RECORDER_CHECKPOINT_INPUTS_H_
#define TORCHRR_RECORDER_CHECKPOINT_INPUTS_H_

#include <cstdint>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

namespace torchrr::recorder {

class CheckpointInputs final : public torch::autograd::Node {
 public:
  // The node's name in traces and reports: where torch keeps the inputs.
  static constexpr const char* kName = "_CheckpointFrame.saved_args";
  // The name of the op that stands for save_inputs (the node's creator, a report's victim).
  static constexpr const char* kSaveOpName = "_CheckpointFrame.save_inputs";

  // A SavedVariable and its place in saved_args (the checkpointed call's argument).
  using Input = std::pair<uint32_t, const torch::autograd::SavedVariable*>;

  explicit CheckpointInputs(std::vector<Input> saved) : Node(UINT64_MAX), saved_(std::move(saved)) {}

  std::string name() const override { return kName; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }

  // The frame's SavedVariables, in saved_args' order (its tensors only); empty once the frame is
  // gone.
  const std::vector<Input>& saved() const { return saved_; }
  // When the frame goes; under the GIL.
  void Clear() { saved_.clear(); }

 private:
  std::vector<Input> saved_;
};

// Whether `node` is a CheckpointInputs. By the type's name, not its address: each library that
// includes this header has its own copy of the type information.
inline bool IsCheckpointInputs(const torch::autograd::Node& node) {
  return typeid(node) == typeid(CheckpointInputs);
}

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_CHECKPOINT_INPUTS_H_
