// GraphCapture: the autograd graph as the ops build it and as backward runs it.
//
// An op's end finds the nodes it created (its outputs' grad_fn, the CopySlices on a view's base)
// and writes a NodeRecord for each, with what the node saved (SavedTensor: the saved version, the
// tensor, its storage and version counter) and its edges; nodes reached through edges that were
// never an op's grad_fn (AccumulateGrad of leaves, nodes made before the recording started) are
// written on first sight too. In backward, each backward function is matched with the node the
// engine runs, which is what lets the replayer re-run autograd's version checks.
//
// Not thread-safe: the session calls it with its mutex held.
#ifndef TORCHRR_RECORDER_GRAPH_CAPTURE_H_
#define TORCHRR_RECORDER_GRAPH_CAPTURE_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <c10/util/flat_hash_map.h>
#include <torch/csrc/autograd/function.h>

#include "capture/id_registry.h"
#include "capture/interner.h"
#include "sink/record_bytes.h"
#include "capture/saved_fingerprints.h"
#include "session/thread_state.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

class GraphCapture {
 public:
  GraphCapture(Interner& interner, IdRegistry& ids, SavedFingerprints& fingerprints)
      : interner_(interner), ids_(ids), fingerprints_(fingerprints) {}

  // The node's id; on first sight adds its NodeRecord (and those of unseen nodes it reaches) to
  // `nodes`, and the definitions and TensorInfos they name to `defs`, which is written first.
  // `creator` is the op whose end this is (nullptr outside an op end).
  format::ObjectId RefNode(torch::autograd::Node* node, const OpFrame* creator,
                           EncodedRecords& defs, NodeScratch& nodes);
  // The nodes the op of `creator` created, through its outputs: their grad_fn, and for an
  // in-place op on a view the CopySlices autograd put on the view's base (whose TensorInfo goes
  // to `defs` too).
  // `hooks`: what the saved-tensor hooks of their saved tensors packed (ReadSavedHooks). A node
  // that an op still running around `creator` created (numbered from `running_since` on, outside
  // creator's own numbers) is left to that op's end: it may still be under construction.
  void RefCreatedNodes(const std::vector<OpOutput>& outputs, const OpFrame& creator,
                       uint64_t running_since, const SavedHooks& hooks, EncodedRecords& defs,
                       NodeScratch& nodes);
  // At an op's start: the grad_fn of each input tensor never seen, recorded now (into `out`;
  // `scratch` is left empty), before the op can change what that node saved. A custom Function's
  // node (a Python Function's, torch.compile's CompiledFunction) has no op whose outputs name it:
  // without this it is first seen when a later op's node reaches it, maybe after a write that
  // bypasses version counters (verify_saved's fingerprint at save would be taken too late). A
  // node numbered from `building_from` on, on this thread, is an enclosing op's, maybe still
  // being built (a pack hook's ops run inside its construction): left to that op's end.
  // `unchecked`: what their Python nodes keep unchecked (ReadInputsUnchecked).
  void RefInputNodes(c10::ArrayRef<const c10::IValue> inputs, uint64_t thread,
                     uint64_t building_from, const UncheckedSaves& unchecked,
                     NodeScratch& scratch, EncodedRecords& out);
  // At the end of a Python Function's apply (the op of `creator`): its node (TakeFunctionNode),
  // which none of the op's outputs names (it shows none), with what its saved tensors' hooks
  // packed, what it keeps unchecked and where backward uses what it saved (`uses`, or null; all
  // read before the lock). Its saved outputs are named by the saved copies.
  void RefFunctionNode(torch::autograd::Node* node, const OpFrame& creator,
                       const SavedHooks& hooks, const UncheckedSaves& unchecked,
                       const SavedUses* uses, EncodedRecords& defs, NodeScratch& nodes);
  // A backward function at its start: the id of the node autograd's engine is running for it
  // (recorded now, into `out`, if never seen: `scratch` is left empty), or 0 when the engine is
  // not running it; `name` receives the node's name and `address` its address.
  format::ObjectId ExecutingNode(const at::RecordFunction& fn, format::InternId* name,
                                 NodeScratch& scratch, EncodedRecords& out, const void** address);
  // A backward function at its end: the node it ran for (the engine's, found at its start, or the
  // one its key names), 0 when unknown. The engine's node has run: its saved storages are unpinned.
  format::ObjectId ExecutedNode(const OpFrame& frame);
  // verify_saved, at a backward function's start: queues the fingerprints of what the node with
  // that key saved (names interned into `out`).
  void FingerprintAtUse(uint64_t forward_thread, int64_t sequence_nr, EncodedRecords& out);
  // Notes an op that ended, with the sequence numbers it spanned (CreatorOf).
  void NoteOpEnded(const OpFrame& frame) {
    recent_ops_[recent_ops_count_++ % kRecentOps] = {frame.thread, frame.op.op,
                                                      frame.sequence_at_start,
                                                      frame.sequence_at_end};
  }
  void Clear() { node_keys_.clear(); }

 private:
  // A node first seen after its creating op ended (found through another node's edges, or as an
  // input's grad_fn): the op that spanned its sequence number on its thread, innermost first (a
  // Python Function.apply is such an op). A C++ torch::autograd::Function's apply is not an op:
  // its node takes the number and its forward runs ops after it; for a custom node, the first op
  // that started with the next number stands for it. 0 when no recent op (recent_ops_) fits.
  format::ObjectId CreatorOf(uint64_t thread, uint64_t sequence_nr, bool custom) const;
  // `state`: the node's table entry's (the storages its saved tensors pin), or nullptr.
  // `returned_by_creator`: the node is what RefNode was given (an output's grad_fn), not one
  // reached from it.
  void WriteNodeRecord(torch::autograd::Node* node, format::ObjectId id,
                       IdRegistry::NodeState* state, const OpFrame* creator,
                       bool returned_by_creator, std::vector<torch::autograd::Node*>& pending,
                       EncodedRecords& defs, NodeScratch& nodes);
  // Fills record.saved (and saved_kind) from what the node saved; a checkpoint's input node seen
  // for the first time goes to `pending`.
  // `outputs_named_later`: an op's end is writing the node, and names its saved outputs after
  // (NameSavedOutputs); otherwise a saved output is named by the saved shallow copy itself.
  void RecordSavedTensors(torch::autograd::Node& node, IdRegistry::NodeState* state,
                          format::NodeRecord& record, EncodedRecords& defs,
                          std::vector<torch::autograd::Node*>& pending, bool outputs_named_later);
  // The tensors RefInputNodes's `unchecked` holds for `node`, as saved entries `checked` false.
  void RecordUncheckedTensors(const torch::autograd::Node& node, IdRegistry::NodeState* state,
                              format::NodeRecord& record, EncodedRecords& defs);
  // The saved entry `index` of the node RefFunctionNode writes: where backward uses it.
  void RecordUse(const torch::autograd::Node& node, size_t index, format::SavedTensor& saved,
                 EncodedRecords& defs);
  // A saved tensor with hooks: what they packed, when ReadSavedHooks read it.
  void RecordHook(const torch::autograd::SavedVariable& sv, format::SavedTensor& saved,
                  IdRegistry::NodeState* state, EncodedRecords& defs,
                  std::vector<torch::autograd::Node*>& pending);
  // Fills record.edges; nodes seen for the first time go to `pending`.
  void RecordEdges(torch::autograd::Node& node, format::NodeRecord& record,
                   std::vector<torch::autograd::Node*>& pending);
  // Keeps the key a backward function will carry for the node (forward thread, sequence number).
  void RememberKey(const torch::autograd::Node& node, const format::NodeRecord& record);

  Interner& interner_;
  IdRegistry& ids_;
  const SavedHooks* hooks_ = nullptr;  // RefCreatedNodes's, while it runs.
  const UncheckedSaves* unchecked_ = nullptr;  // RefInputNodes's, while it runs.
  bool saved_outputs_by_copy_ = false;          // RefFunctionNode's, while it runs.
  // RefFunctionNode's, while it runs: its node, and where backward uses what that node saved.
  const torch::autograd::Node* uses_node_ = nullptr;
  const SavedUses* saved_uses_ = nullptr;
  SavedFingerprints& fingerprints_;
  // (forward thread, sequence_nr) -> node: the key a backward function carries.
  struct NodeKeyHash {
    size_t operator()(const std::pair<uint64_t, int64_t>& key) const {
      return std::hash<uint64_t>()(key.first * 0x9e3779b97f4a7c15ULL ^
                                   static_cast<uint64_t>(key.second));
    }
  };
  struct KeyedNode {
    format::ObjectId id = 0;
    const void* address = nullptr;  // To check, with the registry, that the node is still alive.
  };
  ska::flat_hash_map<std::pair<uint64_t, int64_t>, KeyedNode, NodeKeyHash> node_keys_;
  size_t prune_node_keys_at_ = 4096;
  // The last ops to end, with the sequence numbers they spanned: who created a node first seen
  // after its creating op ended (CreatorOf).
  struct RecentOp {
    uint64_t thread = 0;
    format::ObjectId op = 0;
    uint64_t sequence_at_start = 0;
    uint64_t sequence_at_end = 0;
  };
  static constexpr size_t kRecentOps = 1024;
  std::array<RecentOp, kRecentOps> recent_ops_{};
  uint64_t recent_ops_count_ = 0;
};

// Reads what the saved-tensor hooks of the nodes the op created (the outputs' grad_fn, and the
// CopySlices on a view's base) packed, into `hooks`. Nothing to do, and nothing done, unless the
// thread has hooks registered. Takes the GIL: call it with no lock held.
void ReadSavedHooks(const std::vector<OpOutput>& outputs, SavedHooks& hooks);
// At an op's start, before the session's lock (takes the GIL): what the Python nodes of the
// input tensors keep unchecked (AOTAutograd's _tensors_no_vc_check), for RefInputNodes. Reads a
// node once while the same node keeps coming back.
void ReadInputsUnchecked(c10::ArrayRef<const c10::IValue> inputs, ThreadState& ts);
// What `node`'s saved tensors' hooks packed (ReadSavedHook), appended to `hooks`; takes the GIL
// when a saved tensor has hooks.
void ReadNodeSavedHooks(torch::autograd::Node* node, SavedHooks& hooks);

// A saved output names the output tensor the program holds: autograd saves a shallow copy that
// shares the output's storage and version counter, which RefNode could not name.
void NameSavedOutputs(NodeScratch& nodes, const std::vector<OpOutput>& outputs,
                      const std::vector<format::TensorUse>& uses);

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_GRAPH_CAPTURE_H_
