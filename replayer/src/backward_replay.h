// BackwardReplay: autograd's backward passes, replayed over the trace.
//
// A node execution is two records: the backward op (written at its end, after its children) and
// the NodeExecRecord; either may come first. Once both are in, the execution is checked at its
// start (the seq of the first record of the op's subtree) as SavedVariable::unpack checks it: a
// saved tensor whose counter moved since the save, or whose bytes were written silently, is a
// Finding. Executions are grouped into backward passes (the pass rule, NewPassNeeded); when a node
// threw, PyTorch abandoned the rest of its pass, and the replay runs that rest as autograd would
// have, checked as of the moment the pass stopped.
//
// Not thread-safe: it writes into the AnalysisState it was given, which must outlive it, and
// unwatches nodes in the SilentWriteWatch once they ran.
#ifndef TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_
#define TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "analysis_state.h"
#include "silent_writes.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer {

class BackwardReplay {
 public:
  BackwardReplay(AnalysisState& state, SilentWriteWatch& silent)
      : state_(state), silent_(silent) {}

  // A node's first record (its slot in AnalysisState::nodes).
  void OnNode(uint32_t node_slot);
  // A forward op: evidence for the pass rule (forward work ends the open pass).
  void OnForwardOp(const format::OpRecord& r);
  // A backward function's op; `subtree_first` is the seq of the first record of its subtree.
  void OnBackwardOp(const format::OpRecord& r, uint64_t subtree_first);
  void OnNodeExec(const format::NodeExecRecord& r);
  // The trace ended: runs the executions whose other half never came (a truncated trace) and
  // closes the open pass. Call once.
  void Finish();

 private:
  // A backward op or a NodeExecRecord waiting for its other half.
  struct PendingExec {
    uint64_t start_seq = 0;   // First record of the op's subtree.
    uint64_t record_seq = 0;
    format::ObjectId node = 0;
    uint32_t thread = 0;
    bool threw = false;
    bool have_op = false;
    bool have_exec = false;
  };

  // A nested forward op whose chain of parents may yet reach a backward function.
  struct Candidate {
    format::ObjectId op;
    uint32_t thread;
  };

  enum class Chain { kForward, kBackward, kOpen };

  void RunExec(format::ObjectId exec_op, const PendingExec& exec);
  bool NewPassNeeded(uint32_t node_slot, format::ObjectId exec_op, uint32_t thread);
  Chain Classify(format::ObjectId op, format::ObjectId exec_op) const;
  // `recomputing`: the node whose checkpointed saved tensors made backward read this node's (a
  // checkpoint's inputs), IdIndex::kAbsent when the node itself runs.
  void CheckNode(uint32_t node_slot, uint64_t seq, bool simulated, format::ObjectId exec_op,
                 bool threw, uint32_t recomputing = IdIndex::kAbsent);
  // Activation checkpointing: backward recomputes from the checkpoint's inputs, which node
  // `inputs_node` saved (with their version check), once per pass.
  void CheckRecomputeInputs(format::ObjectId inputs_node, uint32_t node_slot, uint64_t seq,
                            bool simulated, format::ObjectId exec_op, bool threw);
  // The recomputation backward ran inside `exec_op` for checkpoint `inputs_node`: the nodes it
  // made, whose saved tensors stand in for the forward's, matched to them by node name, rank and
  // member.
  void ClaimRecomputation(format::ObjectId inputs_node, format::ObjectId exec_op);
  // What backward got back for saved tensor `s` of a checkpointed node: the recomputed tensor,
  // unchecked by PyTorch; a write to it after the recomputation saved it changes the gradient.
  void CheckRecomputed(uint32_t node_slot, const SavedState& s, const Finding& base, uint64_t seq);
  void CheckVersion(const SavedState& s, const Finding& base, uint64_t seq);
  void CheckFingerprint(SavedState& s, const Finding& base, uint64_t seq, size_t findings_before);
  void EndPass();
  void SimulateRest();
  bool IsAccumulateGrad(const NodeState& node) const;

  AnalysisState& state_;
  SilentWriteWatch& silent_;
  std::unordered_map<format::ObjectId, PendingExec> pending_execs_;  // By backward op id.

  // The open backward pass.
  bool pass_open_ = false;
  bool pass_threw_ = false;
  bool forward_seen_ = false;
  uint64_t pass_index_ = 0;
  uint64_t pass_stop_seq_ = 0;
  uint32_t pass_root_ = IdIndex::kAbsent;
  std::vector<uint32_t> pass_executed_;
  std::vector<uint32_t> pass_threads_;
  std::vector<Candidate> candidates_;
  std::vector<uint32_t> pass_recomputed_;  // Checkpoint input nodes read in the open pass.
  // Nodes with tensors packed by saved-tensor hooks, not yet matched to a recomputation.
  std::vector<uint32_t> packed_nodes_;
  // The open pass's recomputed saved tensors (saved slots), by RecomputeKey.
  std::unordered_map<uint64_t, uint32_t> recomputed_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_
