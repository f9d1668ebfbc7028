#include "repro/repro_slice.h"

#include <algorithm>
#include <unordered_set>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer::repro {

using format::OpRecord;
using format::OpScope;
using format::TensorUse;

TraceIndex::TraceIndex(const std::vector<format::Record>& records) : records_(records) {
  for (size_t i = 0; i < records.size(); ++i) {
    const format::Record& r = records[i];
    if (auto* s = std::get_if<format::StringDef>(&r)) {
      strings_[s->id] = s->text;
    } else if (auto* f = std::get_if<format::FrameDef>(&r)) {
      frames_[f->id] = f;
    } else if (auto* s = std::get_if<format::StackDef>(&r)) {
      stacks_[s->id] = s;
    } else if (auto* op = std::get_if<OpRecord>(&r)) {
      op_at_.emplace(op->op, i);
      has_values_ = has_values_ || !op->values.empty();
    } else if (auto* n = std::get_if<format::NodeRecord>(&r)) {
      nodes_.emplace(n->node, n);
    } else if (auto* t = std::get_if<format::TensorInfo>(&r)) {
      infos_[t->tensor].push_back(i);
    }
  }
  for (const auto& [id, node] : nodes_) {
    if (node->saved_kind == format::SavedSetKind::kCustom && node->created_by != 0 &&
        op_at_.contains(node->created_by)) {
      custom_nodes_.emplace(node->created_by, node);
      custom_outputs_[id];
    }
  }
  std::unordered_set<ObjectId> placed;  // Tensors whose output position is known.
  for (const format::Record& r : records) {
    auto* t = std::get_if<format::TensorInfo>(&r);
    if (t == nullptr || t->grad_fn == 0 || placed.contains(t->tensor)) continue;
    auto outputs = custom_outputs_.find(t->grad_fn);
    if (outputs == custom_outputs_.end()) continue;
    placed.insert(t->tensor);
    outputs->second.emplace(t->output_nr, t);
  }
  // Ops are written at their end, children before parents: the nesting is known only now.
  for (size_t i = 0; i < records.size(); ++i) {
    auto* op = std::get_if<OpRecord>(&records[i]);
    if (op == nullptr || op->scope != OpScope::kFunction || Outermost(op->op) != op->op) continue;
    bool in_backward = false;
    ObjectId up = op->parent;
    for (int depth = 0; up != 0 && depth < 256; ++depth) {
      const OpRecord* parent = Op(up);
      if (parent == nullptr) break;
      if (parent->scope == OpScope::kBackwardFunction) in_backward = true;
      up = parent->parent;
    }
    if (!in_backward) forward_ops_.push_back(op->op);
  }
}

const OpRecord* TraceIndex::Op(ObjectId op) const {
  auto it = op_at_.find(op);
  return it == op_at_.end() ? nullptr : &std::get<OpRecord>(records_[it->second]);
}

const format::NodeRecord* TraceIndex::Node(ObjectId node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : it->second;
}

const format::TensorInfo* TraceIndex::InfoBefore(ObjectId tensor, size_t index) const {
  auto it = infos_.find(tensor);
  if (it == infos_.end()) return nullptr;
  auto after = std::lower_bound(it->second.begin(), it->second.end(), index);
  if (after == it->second.begin()) return nullptr;
  return &std::get<format::TensorInfo>(records_[*(after - 1)]);
}

const format::NodeRecord* TraceIndex::CustomNode(ObjectId op) const {
  auto it = custom_nodes_.find(op);
  return it == custom_nodes_.end() ? nullptr : it->second;
}

std::vector<ObjectId> TraceIndex::Outputs(const OpRecord& op) const {
  std::vector<ObjectId> out;
  const format::NodeRecord* node = CustomNode(op.op);
  // No tensor names the node as its grad_fn (checkpointing's frame, whose node is the frame's
  // saved inputs): what the op recorded returning.
  if (node == nullptr || custom_outputs_.at(node->node).empty()) {
    for (const TensorUse& use : op.outputs) out.push_back(use.tensor);
    return out;
  }
  for (auto [nr, info] : custom_outputs_.at(node->node)) {
    if (nr >= 4096) break;  // An output_nr no Function returns: a hostile trace.
    out.resize(nr + 1, 0);
    out[nr] = info->tensor;
  }
  return out;
}

std::vector<TensorUse> TraceIndex::CallInputs(const OpRecord& op, ObjectId counter) const {
  const format::NodeRecord* node = CustomNode(op.op);
  if (node == nullptr) return op.inputs;
  auto by_place = [](const TensorUse& a, const TensorUse& b) {
    return std::pair(a.position, a.list_index) < std::pair(b.position, b.list_index);
  };
  std::vector<TensorUse> inputs = op.inputs;
  std::stable_sort(inputs.begin(), inputs.end(), by_place);
  const size_t at = IndexOf(op.op);
  std::vector<TensorUse> kept;
  bool grad = false;
  for (const TensorUse& use : inputs) {
    const format::TensorInfo* info = InfoBefore(use.tensor, at);
    // The tensor itself, a view of it (its counter), or its bytes (its storage): StandInCall
    // saves each such save through this input.
    const bool saved = std::any_of(node->saved.begin(), node->saved.end(), [&](const auto& s) {
      return s.defined && s.version_counter == counter &&
             (s.tensor == use.tensor ||
              (info != nullptr && (s.version_counter == info->version_counter ||
                                   s.storage == info->storage)));
    });
    if (!saved) continue;
    kept.push_back(use);
    grad = grad || (info != nullptr && info->requires_grad);
  }
  if (!grad) {
    for (const TensorUse& use : inputs) {
      const format::TensorInfo* info = InfoBefore(use.tensor, at);
      if (info == nullptr || !info->requires_grad) continue;
      kept.insert(std::upper_bound(kept.begin(), kept.end(), use, by_place), use);
      break;
    }
  }
  return kept;
}

const format::TensorInfo* TraceIndex::OutputInfo(const OpRecord& op, ObjectId tensor) const {
  const format::NodeRecord* node = CustomNode(op.op);
  if (node != nullptr && !custom_outputs_.at(node->node).empty()) {
    for (auto [nr, info] : custom_outputs_.at(node->node)) {
      if (info->tensor == tensor) return info;
    }
    return nullptr;
  }
  return InfoBefore(tensor, IndexOf(op.op) + 1);
}

ObjectId TraceIndex::Outermost(ObjectId op) const {
  ObjectId outer = op;
  for (int depth = 0; depth < 256; ++depth) {
    if (custom_nodes_.contains(outer)) break;
    const OpRecord* record = Op(outer);
    if (record == nullptr || record->parent == 0) break;
    // Up into an ATen op, or a custom node's call (its stand-in stands for it), not into an op
    // the script cannot call: a compiled region's op, which ran the ops of its graph when
    // AOTAutograd traced it.
    const OpRecord* parent = Op(record->parent);
    if (parent == nullptr || parent->scope != OpScope::kFunction ||
        !(Str(parent->name).starts_with("aten::") || custom_nodes_.contains(parent->op))) {
      break;
    }
    outer = record->parent;
  }
  return outer;
}

ObjectId TraceIndex::ForwardTwin(ObjectId op, ObjectId after) const {
  if (std::find(forward_ops_.begin(), forward_ops_.end(), op) != forward_ops_.end()) return op;
  const OpRecord* record = Op(op);
  if (record == nullptr) return 0;
  const std::string line = UserLine(*record);
  if (line.empty()) return 0;
  auto same = [&](ObjectId id) {
    const OpRecord* other = Op(id);
    return other->name == record->name && UserLine(*other) == line;
  };
  if (after == 0) {
    auto it = std::find_if(forward_ops_.rbegin(), forward_ops_.rend(), same);
    return it == forward_ops_.rend() ? 0 : *it;
  }
  auto from = std::find(forward_ops_.begin(), forward_ops_.end(), after);
  if (from == forward_ops_.end()) return 0;
  auto it = std::find_if(from + 1, forward_ops_.end(), same);
  return it == forward_ops_.end() ? 0 : *it;
}

const OpRecord* TraceIndex::Producer(ObjectId tensor, ObjectId outer) const {
  // Ops are written at their end: the innermost that returned it comes first.
  for (const format::Record& r : records_) {
    const auto* op = std::get_if<OpRecord>(&r);
    if (op == nullptr || std::none_of(op->outputs.begin(), op->outputs.end(),
                                      [&](const TensorUse& u) { return u.tensor == tensor; })) {
      continue;
    }
    if (op->op == outer || Inside(op->op, [&](ObjectId parent) { return parent == outer; })) {
      return op;
    }
  }
  return nullptr;
}

const std::string& TraceIndex::Str(format::InternId id) const {
  static const std::string kEmpty;
  auto it = strings_.find(id);
  return it == strings_.end() ? kEmpty : it->second;
}

std::string TraceIndex::UserLine(const OpRecord& op) const {
  auto stack = stacks_.find(op.stack);
  if (stack == stacks_.end()) return "";
  for (format::InternId id : stack->second->frames) {
    auto frame = frames_.find(id);
    if (frame == frames_.end() || frame->second->framework) continue;
    const format::FrameDef& f = *frame->second;
    if (Str(f.file).empty()) continue;
    return Str(f.file) + ":" + std::to_string(f.line) + " in " + Str(f.function);
  }
  return "";
}

namespace {

bool Wrote(const TensorUse& use) { return use.version_after != use.version_before; }

bool Has(const std::vector<TensorUse>& uses, ObjectId tensor) {
  return std::any_of(uses.begin(), uses.end(),
                     [&](const TensorUse& u) { return u.tensor == tensor; });
}

// The saved tensor and its views (the tensors of its version counter) the slice rebuilds, grown as
// ops join it. Every other operand is made up as a leaf: its values are random anyway, and
// PyTorch's message names only the saved tensor's shape, versions and grad_fn.
struct Needed {
  std::unordered_set<ObjectId> tensors;

  void Add(const TraceIndex& index, const OpRecord& op, ObjectId saved_counter) {
    const size_t at = index.IndexOf(op.op);
    for (const TensorUse& use : op.inputs) {
      const format::TensorInfo* info = index.InfoBefore(use.tensor, at);
      if (info != nullptr && info->version_counter == saved_counter) tensors.insert(use.tensor);
    }
  }
};

// Whether the slice needs `op`, an op before the culprit: it makes the saved tensor or a view of
// it (its producer chain), or writes it in place before the save (the versions the message
// names).
bool NeededOp(const TraceIndex& index, const OpRecord& op, const Needed& needed,
              ObjectId saved_counter) {
  const size_t at = index.IndexOf(op.op);
  for (const TensorUse& use : op.inputs) {
    if (!Wrote(use)) continue;
    const format::TensorInfo* info = index.InfoBefore(use.tensor, at);
    if (info != nullptr && info->version_counter == saved_counter) return true;
  }
  // An op with no tensor operand (randn, zeros, empty) makes values the script draws itself.
  if (op.inputs.empty()) return false;
  for (ObjectId tensor : index.Outputs(op)) {
    if (needed.tensors.contains(tensor) && !Has(op.inputs, tensor)) return true;
  }
  return false;
}

// The reason the saved tensor, which no op of the slice makes, carries autograd history that a
// leaf would not (a Python autograd.Function's output, a compiled region's, an op the trace did
// not record), or "".
std::string ForeignHistory(const TraceIndex& index, const format::TensorInfo& info) {
  if (info.grad_fn == 0) return "";
  const format::NodeRecord* node = index.Node(info.grad_fn);
  const std::string name = node != nullptr ? index.Str(node->name) : "an unrecorded node";
  if (node == nullptr || node->created_by == 0 ||
      name.find("CompiledFunction") != std::string::npos ||
      (node != nullptr && node->saved_kind == format::SavedSetKind::kCustom)) {
    return "a tensor it uses comes out of " + name +
           ", which the reproducer cannot express (an autograd.Function, a compiled region, or "
           "an op the trace did not record)";
  }
  return "";
}

}  // namespace

std::string BuildSlice(const TraceIndex& index, ObjectId victim, ObjectId culprit,
                       const std::vector<ObjectId>& later_writes, ObjectId saved_counter,
                       Slice* slice) {
  const std::vector<ObjectId>& forward = index.ForwardOps();
  auto victim_at = std::find(forward.begin(), forward.end(), victim);
  // No culprit (a second backward pass): the slice ends at the victim.
  auto culprit_at = culprit == 0 && victim_at != forward.end()
                        ? victim_at + 1
                        : std::find(forward.begin(), forward.end(), culprit);
  if (victim_at == forward.end() || (culprit != 0 && culprit_at == forward.end())) {
    return "the victim or the culprit is not an op of the forward the trace recorded";
  }
  if (victim_at >= culprit_at) return "the culprit does not come after the victim in the trace";

  Needed needed;
  needed.Add(index, *index.Op(victim), saved_counter);
  std::set<ObjectId> in_slice = {victim};
  if (culprit != 0) {
    needed.Add(index, *index.Op(culprit), saved_counter);
    in_slice.insert(culprit);
  }
  // An op that ran inside one the slice calls already (the body of an op outside aten, which a
  // stand-in stands for whole) is not called again.
  auto inside_slice = [&](ObjectId id) {
    return index.Inside(id, [&](ObjectId parent) { return in_slice.contains(parent); });
  };
  // The later writes before the use: the version backward finds is theirs.
  for (ObjectId write : later_writes) {
    const ObjectId outer = index.Outermost(write);
    if (std::find(culprit_at, forward.end(), outer) == forward.end()) continue;
    if (inside_slice(outer)) continue;
    if (in_slice.insert(outer).second) needed.Add(index, *index.Op(outer), saved_counter);
  }
  for (auto it = culprit_at; it != forward.begin();) {
    --it;
    if (in_slice.contains(*it) || inside_slice(*it)) continue;
    const OpRecord& op = *index.Op(*it);
    if (!NeededOp(index, op, needed, saved_counter)) continue;
    in_slice.insert(op.op);
    needed.Add(index, op, saved_counter);
  }

  *slice = Slice{};
  slice->victim = victim;
  slice->culprit = culprit;
  for (ObjectId id : forward) {
    if (in_slice.contains(id)) slice->ops.push_back(id);
  }
  // Which tensors are made up: those no earlier op of the slice made.
  std::unordered_set<ObjectId> defined;
  std::multimap<ObjectId, ObjectId> by_storage;  // Storage -> slice tensors over it, made so far.
  std::vector<std::pair<uint64_t, ObjectId>> by_address;  // Their storages' recorded addresses.
  for (size_t k = 0; k < slice->ops.size(); ++k) {
    const OpRecord& op = *index.Op(slice->ops[k]);
    const size_t at = index.IndexOf(op.op);
    for (const TensorUse& use : index.CallInputs(op, saved_counter)) {
      const format::TensorInfo* info = index.InfoBefore(use.tensor, at);
      if (info == nullptr) return "the trace holds no metadata for a tensor the slice uses";
      if (defined.contains(use.tensor)) continue;
      // The saved tensor made by what the slice cannot call.
      if (info->version_counter == saved_counter) {
        if (std::string why = ForeignHistory(index, *info); !why.empty()) return why;
      }
      defined.insert(use.tensor);
      slice->leaves.push_back(use.tensor);
      slice->leaf_use[use.tensor] = k;
      // `.data` (not an op): the same bytes as a tensor the slice made, another counter.
      if (!info->requires_grad) {
        for (auto [s, e] = by_storage.equal_range(info->storage); s != e; ++s) {
          const format::TensorInfo* base = index.InfoBefore(s->second, at);
          // A storage id is given again to a storage made where a dead one's was: the recorded
          // data addresses, where there are some, say whether it is the same memory.
          if (base != nullptr && base->version_counter != info->version_counter &&
              base->dtype == info->dtype && base->storage_nbytes == info->storage_nbytes &&
              (base->storage_address == 0 || info->storage_address == 0 ||
               base->storage_address == info->storage_address)) {
            slice->data_of[use.tensor] = s->second;
            break;
          }
        }
      }
      // Another storage over the same memory (from_blob, DLPack): a view of that tensor's bytes.
      if (!info->requires_grad && !slice->data_of.contains(use.tensor) &&
          info->storage_address != 0) {
        for (auto [address, tensor] : by_address) {
          const format::TensorInfo* base = index.InfoBefore(tensor, at);
          const size_t size = DTypeSize(info->dtype);
          if (base == nullptr || base->storage == info->storage || base->dtype != info->dtype ||
              size == 0 || info->storage_address < address ||
              info->storage_address >= address + base->storage_nbytes ||
              (info->storage_address - address) % size != 0) {
            continue;
          }
          slice->data_of[use.tensor] = tensor;
          slice->data_offset[use.tensor] =
              info->storage_offset + static_cast<int64_t>((info->storage_address - address) / size);
          break;
        }
      }
      by_storage.emplace(info->storage, use.tensor);
      if (info->storage_address != 0) by_address.emplace_back(info->storage_address, use.tensor);
    }
    for (ObjectId tensor : index.Outputs(op)) {
      if (tensor != 0 && defined.insert(tensor).second) {
        if (const format::TensorInfo* info = index.OutputInfo(op, tensor)) {
          by_storage.emplace(info->storage, tensor);
          if (info->storage_address != 0) by_address.emplace_back(info->storage_address, tensor);
        }
      }
    }
  }
  if (culprit != 0) {
    for (const TensorUse& use : index.Op(culprit)->inputs) {
      if (Wrote(use)) slice->written.insert(use.tensor);
    }
  }
  const OpRecord& made = *index.Op(victim);
  for (ObjectId tensor : index.Outputs(made)) {
    const format::TensorInfo* info = tensor == 0 ? nullptr : index.OutputInfo(made, tensor);
    if (info != nullptr && info->requires_grad &&
        std::find(slice->uses.begin(), slice->uses.end(), tensor) == slice->uses.end()) {
      slice->uses.push_back(tensor);
    }
  }
  if (slice->uses.empty()) return "the victim's outputs do not require grad: no backward to run";
  return "";
}

}  // namespace torchrr::replayer::repro
