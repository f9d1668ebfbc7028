// BackwardReplay: autograd's backward passes, replayed over the trace.
//
// A node execution is two records: the backward op (written at its end, after its children) and
// the NodeExecRecord; either may come first. Once both are in, the execution is checked at its
// start (the seq of the first record of the op's subtree) as SavedVariable::unpack checks it: a
// saved input detached in place, a saved tensor whose counter moved since the save, or whose
// bytes were written silently, is a Finding; an execution that threw adds the findings only its
// error can confirm (freed by an earlier pass, an unpack hook's tensor). Executions are grouped
// into backward passes (the pass rule, FindPass); several may be open at once, one per thread
// that called backward(). When a node threw, PyTorch abandoned the rest of its pass, and the
// replay runs that rest as autograd would have, checked as of the moment the pass stopped.
//
// Not thread-safe: it writes into the AnalysisState it was given, which must outlive it, and
// unwatches nodes in the SilentWriteWatch once they ran.
#ifndef TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_
#define TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_

#include <cstdint>
#include <unordered_map>
#include <utility>
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
  // An op that is not a backward function: evidence for the pass rule (forward work on a thread
  // ends the passes that thread ran) and where the next pass on its thread was entered.
  void OnForwardOp(const format::OpRecord& r);
  // A backward function's op; `subtree_first` is the seq of the first record of its subtree.
  void OnBackwardOp(const format::OpRecord& r, uint64_t subtree_first);
  void OnNodeExec(const format::NodeExecRecord& r);
  // The trace ended: runs the executions whose other half never came (a truncated trace) and
  // closes the open passes. Call once.
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
    std::vector<format::UnpackedTensor> unpacked;  // The NodeExecRecord's.
  };

  // An open backward pass.
  struct Pass {
    uint64_t index = 0;
    uint32_t root = IdIndex::kAbsent;  // Its first known node.
    bool threw = false;
    uint64_t stop_seq = 0;             // When it threw: the record of the execution that threw.
    std::vector<uint32_t> executed;    // Node slots, in order.
    std::vector<uint32_t> threads;     // Threads that ran its nodes.
    // Threads that built its graph (its nodes' forward threads): on CUDA, the one that called
    // backward() while a device's worker thread runs the nodes.
    std::vector<uint64_t> builders;
    // Activation checkpointing: the checkpoints' input nodes read in this pass, and the saved
    // tensors their recomputations saved (slots), by RecomputeKey.
    std::vector<uint32_t> recomputed_inputs;
    std::unordered_map<uint64_t, uint32_t> recomputed;
    bool Ran(uint32_t thread) const;
    bool Built(uint64_t thread) const;
  };

  void RunExec(format::ObjectId exec_op, const PendingExec& exec);
  Pass* FindPass(uint32_t node_slot, uint32_t thread);
  bool Reaches(const Pass& pass, uint32_t node_slot) const;
  Pass& OpenPass(uint32_t node_slot, uint32_t thread);
  // `recomputing`: the node whose checkpointed saved tensors made backward read this node's (a
  // checkpoint's inputs), IdIndex::kAbsent when the node itself runs.
  void CheckNode(uint32_t node_slot, uint64_t seq, bool simulated, format::ObjectId exec_op,
                 bool threw, Pass& pass, uint32_t recomputing = IdIndex::kAbsent);
  // Activation checkpointing: backward recomputes from the checkpoint's inputs, which node
  // `inputs_node` saved (with their version check), once per pass.
  void CheckRecomputeInputs(format::ObjectId inputs_node, uint32_t node_slot, uint64_t seq,
                            bool simulated, format::ObjectId exec_op, bool threw, Pass& pass);
  // The recomputation backward ran inside `exec_op` for checkpoint `inputs_node`: the nodes it
  // made, whose saved tensors stand in for the forward's, matched to them by node name, rank and
  // member.
  void ClaimRecomputation(format::ObjectId inputs_node, format::ObjectId exec_op, Pass& pass);
  // What backward got back for saved tensor `s` of a checkpointed node: the recomputed tensor,
  // unchecked by PyTorch; a write to it after the recomputation saved it changes the gradient.
  void CheckRecomputed(uint32_t node_slot, const SavedState& s, const Finding& base, uint64_t seq,
                       const Pass& pass);
  void CheckDetached(const SavedState& s, const Finding& base, uint64_t seq);
  void CheckVersion(const SavedState& s, const Finding& base, uint64_t seq);
  void CheckStorageSwap(const SavedState& s, const Finding& base, uint64_t seq);
  // Whether the last write since the save (`last`) left the saved tensor's storage with the
  // lineage it had at the save (ContentLineage: FSDP2's refill of a parameter it freed), in an
  // execution that did not throw (or one a pass that threw never ran): backward read, or would
  // have read, the saved bytes.
  bool PutBack(const SavedState& s, const Finding& base, const Bump* last) const;
  // The first write to a parameter (a leaf that requires grad) strictly between two records; 0
  // when none. A restoration is not taken on trust across one: a wrapper subclass's parameter
  // (DTensor) is written as the wrapper, while the lineage follows the shard inside it. Where
  // the trace ties wrappers to their shards (format 1.9), only writes to wrappers count: a plain
  // parameter's write (another model's EMA, a clamp) is in the lineage if the refill read it.
  format::ObjectId ParameterWrittenBetween(uint64_t after_seq, uint64_t before_seq) const;
  // A use whose writes since the save put back the saved bytes: counted, and listed up to a bound.
  void NoteRestored(const Finding& base, format::ObjectId writer);
  void CheckFingerprint(SavedState& s, const Finding& base, uint64_t seq, size_t findings_before);
  void AddCachedMutated(uint32_t node_slot, format::ObjectId exec_op, uint64_t pass);
  // What the node's unpack hooks returned unlike what it saved, in an execution that did not
  // throw: a silently wrong gradient each.
  void AddUnpackedFindings(uint32_t node_slot, format::ObjectId exec_op, uint64_t pass,
                           const std::vector<format::UnpackedTensor>& unpacked);
  void AddThrowFindings(uint32_t node_slot, format::ObjectId exec_op, uint64_t pass,
                        uint64_t earlier_pass, format::ObjectId earlier_exec_op,
                        const std::vector<format::UnpackedTensor>& unpacked);
  void EndPass(size_t open_index);
  void SimulateRest(Pass& pass);
  bool IsAccumulateGrad(const NodeState& node) const;

  AnalysisState& state_;
  SilentWriteWatch& silent_;
  std::unordered_map<format::ObjectId, PendingExec> pending_execs_;  // By backward op id.
  std::vector<Pass> open_passes_;  // Oldest first.
  // Per thread, the last op with a stack (one the user called) since a pass last opened there.
  // A map: a trace may name any number of threads (one op on each), and each op looks its up.
  std::unordered_map<uint32_t, format::ObjectId> last_called_op_;
  // Nodes with tensors packed by saved-tensor hooks, not yet matched to a recomputation.
  std::vector<uint32_t> packed_nodes_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_BACKWARD_REPLAY_H_
