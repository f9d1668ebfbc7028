// The slice of a trace that a reproducer replays: the forward ops that rebuild a violation's saved
// tensor and the culprit's operands from leaves, the victim, the culprit, and which tensors the
// script makes up as seeded random leaves.
#ifndef TORCHRR_REPLAYER_REPRO_REPRO_SLICE_H_
#define TORCHRR_REPLAYER_REPRO_REPRO_SLICE_H_

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::replayer::repro {

using format::ObjectId;

// What the slice and the script look up in the records, by id. Points into `records`, which must
// outlive it.
class TraceIndex {
 public:
  explicit TraceIndex(const std::vector<format::Record>& records);

  const format::OpRecord* Op(ObjectId op) const;
  size_t IndexOf(ObjectId op) const { return op_at_.at(op); }
  const format::NodeRecord* Node(ObjectId node) const;
  // The tensor's last TensorInfo written before record `index`; nullptr when none.
  const format::TensorInfo* InfoBefore(ObjectId tensor, size_t index) const;
  // The op the user called that `op` ran inside (itself when it is one): its ancestors while they
  // are ATen ops or the call of a custom node, stopping at such a call (a stand-in stands for it
  // whole).
  ObjectId Outermost(ObjectId op) const;
  // The custom node (an autograd.Function's, a compiled region's) `op` created, or nullptr: such
  // an op has no ATen overload to call, and the script calls a stand-in in its place.
  const format::NodeRecord* CustomNode(ObjectId op) const;
  // The tensors `op` returned, by output position. The recorder sees no outputs of an op with a
  // custom node (an autograd.Function's apply is not a dispatcher op): those are the tensors whose
  // first TensorInfo with that node as grad_fn says which output they are; 0 where none says.
  std::vector<ObjectId> Outputs(const format::OpRecord& op) const;
  // The tensors the script passes `op`: its recorded inputs; for a stand-in (an op with a custom
  // node), in call order, only those the node's saves of the version counter `counter` (the
  // violation's) are, or are views or bytes of, since the stand-in computes nothing from the
  // others (a compiled region takes every parameter of the model), and one that requires grad
  // when none of those does, so that its outputs require grad as the recorded ones did.
  std::vector<format::TensorUse> CallInputs(const format::OpRecord& op, ObjectId counter) const;
  // The metadata of `tensor`, an output of `op`, as the op returned it; nullptr when unknown.
  const format::TensorInfo* OutputInfo(const format::OpRecord& op, ObjectId tensor) const;
  // For `op`, an op checkpointing recomputed inside backward: the forward op it ran again, the
  // first outermost forward op after `after` (0: the last one) with its name and user line; `op`
  // itself when it is a forward op, 0 when none is found.
  ObjectId ForwardTwin(ObjectId op, ObjectId after) const;
  // The innermost op inside the call `outer` (or `outer` itself) that returned `tensor`; nullptr
  // when none did.
  const format::OpRecord* Producer(ObjectId tensor, ObjectId outer) const;
  // Whether `op` ran inside an op for which `is_outer(id)` holds: its parent, its parent's
  // parent, and so on (not `op` itself), 256 levels at most.
  template <typename IsOuter>
  bool Inside(ObjectId op, IsOuter&& is_outer) const {
    const format::OpRecord* record = Op(op);
    for (int depth = 0; record != nullptr && record->parent != 0 && depth < 256; ++depth) {
      if (is_outer(record->parent)) return true;
      record = Op(record->parent);
    }
    return false;
  }
  // The outermost forward ops (not inside a backward function), in file order: their ids.
  const std::vector<ObjectId>& ForwardOps() const { return forward_ops_; }
  const std::string& Str(format::InternId id) const;
  // "path:line in function" of the op's first user frame (the innermost not in framework code);
  // "" when the trace has no stack for it.
  std::string UserLine(const format::OpRecord& op) const;
  uint64_t ops() const { return op_at_.size(); }
  // Whether any op has a non-tensor argument: none has in a trace redacted with --drop-values.
  bool has_values() const { return has_values_; }

 private:
  const std::vector<format::Record>& records_;
  std::unordered_map<format::InternId, std::string> strings_;
  std::unordered_map<format::InternId, const format::FrameDef*> frames_;
  std::unordered_map<format::InternId, const format::StackDef*> stacks_;
  std::unordered_map<ObjectId, size_t> op_at_;
  std::unordered_map<ObjectId, const format::NodeRecord*> nodes_;
  std::unordered_map<ObjectId, std::vector<size_t>> infos_;  // Record indices, ascending.
  std::unordered_map<ObjectId, const format::NodeRecord*> custom_nodes_;  // By created_by.
  // Custom node -> output_nr -> the first TensorInfo with the node as grad_fn of that output.
  std::unordered_map<ObjectId, std::map<uint32_t, const format::TensorInfo*>> custom_outputs_;
  std::vector<ObjectId> forward_ops_;
  bool has_values_ = false;
};

struct Slice {
  std::vector<ObjectId> ops;  // Outermost forward ops, in file order; victim and culprit among them.
  ObjectId victim = 0;
  ObjectId culprit = 0;
  // Tensors no op of the slice produces, in the order of their first use: made up as leaves.
  std::vector<ObjectId> leaves;
  std::map<ObjectId, size_t> leaf_use;     // Leaf -> the op (index into `ops`) that first uses it.
  // A leaf over another slice tensor's bytes with a counter of its own (`.data`): leaf -> that
  // tensor.
  std::map<ObjectId, ObjectId> data_of;
  // Such a leaf over another storage at the same memory (from_blob, DLPack: --verify-saved records
  // the addresses): its storage offset in elements of that tensor's storage.
  std::map<ObjectId, int64_t> data_offset;
  std::set<ObjectId> written;  // The culprit's inputs whose version it moved.
  std::vector<ObjectId> uses;  // The victim's outputs that require grad: what backward starts from.
};

// The slice for a violation whose victim and culprit are the outermost ops `victim` and
// `culprit` (0 for none: a second backward pass through what the victim saved), `later_writes`
// the ops that wrote the saved tensor after the culprit and before the
// use, and `saved_counter` the saved tensor's version counter. It keeps the ops that make the
// saved tensor and its views, those that write it, the victim and the culprit; every other
// operand becomes a leaf. Returns "" and fills *slice, or the reason, one line, that the slice
// holds what a script cannot express.
std::string BuildSlice(const TraceIndex& index, ObjectId victim, ObjectId culprit,
                       const std::vector<ObjectId>& later_writes, ObjectId saved_counter,
                       Slice* slice);

}  // namespace torchrr::replayer::repro

#endif  // TORCHRR_REPLAYER_REPRO_REPRO_SLICE_H_
