#include "capture/graph_capture.h"

#include <algorithm>
#include <memory>
#include <string>
#include <typeinfo>

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include "capture/checkpoint_inputs.h"
#include "capture/op_arguments.h"
#include "capture/saved_variables.h"
#include "internals/torch_internals.h"

namespace torchrr::recorder {

using format::ObjectId;

namespace {

// Points `member` at `value` for the scope's length.
template <typename T>
class ScopedPointer {
 public:
  ScopedPointer(const T*& member, const T& value) : member_(member) { member_ = &value; }
  ~ScopedPointer() { member_ = nullptr; }
  ScopedPointer(const ScopedPointer&) = delete;
  ScopedPointer& operator=(const ScopedPointer&) = delete;

 private:
  const T*& member_;
};

}  // namespace

ObjectId GraphCapture::RefNode(torch::autograd::Node* node, const OpFrame* creator,
                               EncodedRecords& defs, NodeScratch& nodes) {
  if (node == nullptr) return 0;
  std::vector<torch::autograd::Node*> pending;
  bool created = false;
  auto& entry = ids_.LookupNode(node, created);
  ObjectId id = entry.id;
  if (!created) return id;
  WriteNodeRecord(node, id, &entry.extra, creator, /*returned_by_creator=*/true, pending, defs,
                  nodes);
  // Nodes reached through edges that were never seen as an op's grad_fn (AccumulateGrad of
  // leaves, nodes created before the recording started).
  while (!pending.empty()) {
    torch::autograd::Node* next = pending.back();
    pending.pop_back();
    auto* next_entry = ids_.FindNodeEntry(next);
    WriteNodeRecord(next, next_entry != nullptr ? next_entry->id : 0,
                    next_entry != nullptr ? &next_entry->extra : nullptr, creator,
                    /*returned_by_creator=*/false, pending, defs, nodes);
  }
  return id;
}

void GraphCapture::RefCreatedNodes(const std::vector<OpOutput>& outputs, const OpFrame& creator,
                                   uint64_t running_since, const SavedHooks& hooks,
                                   EncodedRecords& defs, NodeScratch& nodes) {
  ScopedPointer<SavedHooks> set_hooks(hooks_, hooks);
  auto enclosing_ops = [&](const torch::autograd::Node* node) {
    const uint64_t n = node->sequence_nr();
    return node->thread_id() == creator.thread && n != UINT64_MAX && n >= running_since &&
           (n < creator.sequence_at_start || n >= creator.sequence_at_end);
  };
  for (const OpOutput& output : outputs) {
    const at::Tensor& t = *output.tensor;
    torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(t);
    if (grad_fn != nullptr && !enclosing_ops(grad_fn)) RefNode(grad_fn, &creator, defs, nodes);
    if (!t.is_view()) continue;
    auto* view_meta = torch::autograd::impl::get_view_autograd_meta(t);
    if (view_meta != nullptr && view_meta->has_bw_view()) {
      const at::Tensor& base = view_meta->get_backward_view().base_;
      torch::autograd::Node* base_fn = torch::autograd::impl::grad_fn_unsafe(base);
      if (base_fn != nullptr) RefNode(base_fn, &creator, defs, nodes);
      ids_.RefTensor(base, defs);
    }
  }
}

void GraphCapture::WriteNodeRecord(torch::autograd::Node* node, ObjectId id,
                                   IdRegistry::NodeState* state, const OpFrame* creator,
                                   bool returned_by_creator,
                                   std::vector<torch::autograd::Node*>& pending,
                                   EncodedRecords& defs, NodeScratch& nodes) {
  format::NodeRecord& record = nodes.Next();
  record.node = id;
  bool accumulate_grad = false;
  record.name = interner_.NodeName(*node, defs, nullptr, &accumulate_grad);
  record.forward_thread = node->thread_id();
  uint64_t sequence_nr = node->sequence_nr();
  record.sequence_nr = static_cast<int64_t>(sequence_nr);
  if (creator != nullptr && node->thread_id() == creator->thread &&
      sequence_nr >= creator->sequence_at_start && sequence_nr < creator->sequence_at_end) {
    record.created_by = creator->op.op;
  }
  // Checkpointing's inputs have no sequence number: made by the op that returns them
  // (_CheckpointFrame.save_inputs), not by one that reaches them through a placeholder.
  if (creator != nullptr && returned_by_creator && IsCheckpointInputs(*node)) {
    record.created_by = creator->op.op;
  }
  if (accumulate_grad) {
    auto* accumulate = static_cast<torch::autograd::AccumulateGrad*>(node);
    record.variable = ids_.RefTensor(accumulate->variable, defs);
  }
  RecordSavedTensors(*node, state, record, defs, pending,
                     /*outputs_named_later=*/creator != nullptr);
  if (record.created_by == 0 && sequence_nr != UINT64_MAX) {
    record.created_by = CreatorOf(node->thread_id(), sequence_nr,
                                  record.saved_kind == format::SavedSetKind::kCustom);
  }
  // The edges' lookups may move the registry's entries: `state` is not used after them.
  RecordEdges(*node, record, pending);
  if (sequence_nr != UINT64_MAX) RememberKey(*node, record);
}

void GraphCapture::RecordSavedTensors(torch::autograd::Node& node, IdRegistry::NodeState* state,
                                      format::NodeRecord& record, EncodedRecords& defs,
                                      std::vector<torch::autograd::Node*>& pending,
                                      bool outputs_named_later) {
  const bool verify = fingerprints_.enabled();
  const ObjectId id = record.node;
  record.saved_kind = VisitSavedVariables(
      node, [&](const char* name, uint32_t list_index, const torch::autograd::SavedVariable& sv) {
        SavedVariableFacts facts = ReadSavedVariable(sv);
        format::SavedTensor saved;
        saved.name = interner_.OpName(name, defs);  // The generated table's literals: stable.
        saved.list_index = list_index;
        saved.defined = facts.defined;
        saved.has_hooks = facts.has_hooks;
        saved.is_output = facts.is_output;
        saved.is_leaf = facts.is_leaf;
        saved.saved_version = facts.saved_version;
        saved.output_nr = facts.output_nr;
        saved.checked = !facts.has_hooks;  // SavedVariable::unpack skips the check under hooks.
        if (facts.has_hooks) RecordHook(sv, saved, state, defs, pending);
        if (facts.data != nullptr) {
          const c10::TensorImpl& impl = *facts.data->unsafeGetTensorImpl();
          // A saved output is a shallow copy sharing the output's storage and counter; the op's
          // end names the output the program holds instead (NameSavedOutputs). A node first seen
          // elsewhere (a custom Function's, whose apply has no outputs a RecordFunction shows)
          // has no op to name it: the copy describes the same bytes.
          if (facts.saved_original || !outputs_named_later || saved_outputs_by_copy_) {
            saved.tensor = ids_.RefTensor(*facts.data, defs, nullptr, &saved.version_counter);
          } else {
            saved.version_counter = ids_.VersionCounterId(impl);
          }
          // The same id RefTensor gave (the storage lives), pinned until the node runs.
          saved.storage = ids_.StorageId(impl, state);
          if (verify) {
            fingerprints_.Queue(id, saved.name, list_index, *facts.data, saved.tensor,
                                saved.storage, format::FingerprintWhen::kAtSave);
          }
        }
        RecordUse(node, record.saved.size(), saved, defs);
        record.saved.push_back(saved);
      });
  if (unchecked_ != nullptr) RecordUncheckedTensors(node, state, record, defs);
  if (record.saved_kind == format::SavedSetKind::kUnknown) {
    std::string type = typeid(node).name();
    if (type.find("CppNode") != std::string::npos || type.find("PyNode") != std::string::npos) {
      record.saved_kind = format::SavedSetKind::kCustom;
    }
  }
}

void GraphCapture::RecordUncheckedTensors(const torch::autograd::Node& node,
                                          IdRegistry::NodeState* state,
                                          format::NodeRecord& record, EncodedRecords& defs) {
  auto it = std::find_if(unchecked_->begin(), unchecked_->end(),
                         [&node](const auto& entry) { return entry.first == &node; });
  if (it == unchecked_->end()) return;
  const size_t checked_end = record.saved.size();
  for (const UncheckedTensor& item : it->second) {
    const at::Tensor& t = item.tensor;
    format::SavedTensor saved;
    saved.name = interner_.String(item.name, defs);
    saved.list_index = item.list_index;
    saved.defined = t.defined();
    saved.checked = false;  // Backward reads the list, or the attribute, as it is then.
    if (t.defined()) {
      const c10::TensorImpl& impl = *t.unsafeGetTensorImpl();
      saved.tensor = ids_.RefTensor(t, defs, nullptr, &saved.version_counter);
      // A ctx attribute's tensor ("ctx....") that save_for_backward also saved (or a view of it,
      // with its counter): PyTorch's check covers it. AOTAutograd's list is kept whole: its
      // items' places are those RecordUse reads the region's saved uses by.
      if (item.name.starts_with("ctx.") &&
          std::any_of(record.saved.begin(), record.saved.begin() + checked_end,
                      [&](const format::SavedTensor& other) {
                        return other.checked && other.defined &&
                               other.version_counter == saved.version_counter;
                      })) {
        continue;
      }
      saved.storage = ids_.StorageId(impl, state);
      // Its version now, right after the region's forward: what a later write moves from.
      saved.saved_version = ReadVersionCounter(VersionCounterOf(impl));
      saved.is_leaf = t.is_leaf();
      if (fingerprints_.enabled()) {
        fingerprints_.Queue(record.node, saved.name, saved.list_index, t, saved.tensor,
                            saved.storage, format::FingerprintWhen::kAtSave);
      }
    }
    RecordUse(node, record.saved.size(), saved, defs);
    record.saved.push_back(saved);
  }
}

void GraphCapture::RecordHook(const torch::autograd::SavedVariable& sv, format::SavedTensor& saved,
                              IdRegistry::NodeState* state, EncodedRecords& defs,
                              std::vector<torch::autograd::Node*>& pending) {
  saved.hook = format::SavedHook::kOpaque;
  if (hooks_ == nullptr) return;
  auto it = std::find_if(hooks_->begin(), hooks_->end(),
                         [&sv](const auto& entry) { return entry.first == &sv; });
  if (it == hooks_->end()) return;
  const SavedHookFacts& facts = it->second;
  saved.hook = facts.kind;
  if (facts.unpack_hook.code != 0) {
    if (!facts.new_codes.empty()) {
      std::vector<PythonCode> codes = facts.new_codes;
      interner_.AddPythonCodes(codes);
    }
    saved.unpack_hook = interner_.Stack(nullptr, 0, &facts.unpack_hook, 1, defs);
  }
  if (facts.kind == format::SavedHook::kPackedTensor && facts.packed.defined()) {
    // What backward will get back: the saved tensor itself (a write to it in between changes the
    // gradient, unchecked) or a copy (later writes to the original do not matter). Its version
    // now, at the end of the op that saved it, is the one to compare against.
    const c10::TensorImpl& impl = *facts.packed.unsafeGetTensorImpl();
    saved.tensor = ids_.RefTensor(facts.packed, defs, nullptr, &saved.version_counter);
    saved.storage = ids_.StorageId(impl, state);
    saved.saved_version = ReadVersionCounter(VersionCounterOf(impl));
  } else if (facts.kind == format::SavedHook::kCheckpoint && facts.recompute_from) {
    bool created = false;
    torch::autograd::Node* inputs_node = facts.recompute_from.get();
    saved.recompute_from = ids_.LookupNode(inputs_node, created).id;
    if (created) pending.push_back(inputs_node);
  }
}

void GraphCapture::RecordEdges(torch::autograd::Node& node, format::NodeRecord& record,
                               std::vector<torch::autograd::Node*>& pending) {
  const auto& edges = node.next_edges();
  record.edges.reserve(edges.size());
  for (const auto& edge : edges) {
    format::Edge out_edge;
    out_edge.input_nr = edge.input_nr;
    if (edge.function) {
      bool created = false;
      torch::autograd::Node* next = edge.function.get();
      out_edge.node = ids_.LookupNode(next, created).id;
      if (created) pending.push_back(next);
    }
    record.edges.push_back(out_edge);
  }
}

void GraphCapture::RememberKey(const torch::autograd::Node& node,
                               const format::NodeRecord& record) {
  node_keys_[{node.thread_id(), record.sequence_nr}] = KeyedNode{record.node, &node};
  if (node_keys_.size() < prune_node_keys_at_) return;
  for (auto it = node_keys_.begin(); it != node_keys_.end();) {
    it = ids_.FindNode(it->second.address) == it->second.id ? std::next(it) : node_keys_.erase(it);
  }
  prune_node_keys_at_ = std::max<size_t>(4096, 2 * node_keys_.size());
}

void GraphCapture::RefInputNodes(c10::ArrayRef<const c10::IValue> inputs, uint64_t thread,
                                 uint64_t building_from, const UncheckedSaves& unchecked,
                                 NodeScratch& scratch, EncodedRecords& out) {
  ScopedPointer<UncheckedSaves> set_unchecked(unchecked_, unchecked);
  ForEachInputTensor(inputs, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(t);
    if (grad_fn == nullptr || ids_.FindNode(grad_fn) != 0) return;
    const uint64_t n = grad_fn->sequence_nr();
    if (grad_fn->thread_id() == thread && n != UINT64_MAX && n >= building_from) return;
    RefNode(grad_fn, nullptr, out, scratch);
    for (const format::NodeRecord& record : scratch) out.Add(record);
    scratch.size = 0;
  });
}

void GraphCapture::RefFunctionNode(torch::autograd::Node* node, const OpFrame& creator,
                                   const SavedHooks& hooks, const UncheckedSaves& unchecked,
                                   const SavedUses* uses, EncodedRecords& defs,
                                   NodeScratch& nodes) {
  ScopedPointer<SavedHooks> set_hooks(hooks_, hooks);
  ScopedPointer<UncheckedSaves> set_unchecked(unchecked_, unchecked);
  saved_outputs_by_copy_ = true;
  if (uses != nullptr) {
    std::vector<PythonCode> codes = uses->codes;
    interner_.AddPythonCodes(codes);
    uses_node_ = node;
    saved_uses_ = uses;
  }
  RefNode(node, &creator, defs, nodes);
  saved_outputs_by_copy_ = false;
  uses_node_ = nullptr;
  saved_uses_ = nullptr;
}

void GraphCapture::RecordUse(const torch::autograd::Node& node, size_t index,
                             format::SavedTensor& saved, EncodedRecords& defs) {
  if (&node != uses_node_ || saved_uses_ == nullptr || index >= saved_uses_->stacks.size()) return;
  const std::vector<PythonFrame>& stack = saved_uses_->stacks[index];
  saved.used_at = interner_.Stack(nullptr, 0, stack.data(), stack.size(), defs);
}

ObjectId GraphCapture::ExecutingNode(const at::RecordFunction& fn, format::InternId* name,
                                     NodeScratch& scratch, EncodedRecords& out,
                                     const void** address) {
  // The engine names the node it runs (NodeGuard, around the node's whole evaluation). The node
  // must be this function's: a node called directly (a user calling grad_fn, a hook calling a
  // node) runs outside that guard, or inside another node's.
  compat::NodePtr node = torch::autograd::get_current_node();
  if (!node || static_cast<int64_t>(node->sequence_nr()) != fn.seqNr() ||
      node->thread_id() != fn.forwardThreadId()) {
    return 0;
  }
  // Nodes without a sequence number (AccumulateGrad, GraphRoot) share the key: the name too.
  const std::string* text = nullptr;
  const format::InternId name_id = interner_.NodeName(*node, out, &text);
  if (fn.seqNr() < 0 && *text != fn.name()) return 0;
  *name = name_id;  // The function's name: the engine's RecordFunction is named node->name().
  *address = node.get();
  ObjectId id = ids_.FindNode(node.get());
  if (id != 0) return id;
  // Never seen: a GraphRoot, or a node made before the recording started. Its record is written
  // now, before it runs and releases what it saved.
  id = RefNode(node.get(), nullptr, out, scratch);
  for (const format::NodeRecord& record : scratch) out.Add(record);
  scratch.size = 0;
  return id;
}

ObjectId GraphCapture::ExecutedNode(const OpFrame& frame) {
  if (frame.exec_node != 0) {
    ids_.UnpinSavedStorages(frame.exec_node_address, frame.exec_node);
    return frame.exec_node;
  }
  // Not the engine's node: by the key the function carries.
  auto it = node_keys_.find({frame.op.forward_thread, frame.op.sequence_nr});
  if (it != node_keys_.end() && ids_.FindNode(it->second.address) == it->second.id) {
    return it->second.id;
  }
  return 0;
}

ObjectId GraphCapture::CreatorOf(uint64_t thread, uint64_t sequence_nr, bool custom) const {
  const size_t n = std::min<uint64_t>(recent_ops_count_, kRecentOps);
  ObjectId spanning = 0;     // The innermost op that spanned the number.
  ObjectId first_after = 0;  // The first op that started after the node was made.
  for (size_t i = 1; i <= n; ++i) {  // Latest first: nested ops end before theirs.
    const RecentOp& r = recent_ops_[(recent_ops_count_ - i) % kRecentOps];
    if (r.thread != thread) continue;
    if (r.sequence_at_end <= sequence_nr) break;  // This op, and all before it, ended before.
    if (sequence_nr >= r.sequence_at_start) {
      spanning = r.op;
    } else if (custom && r.sequence_at_start == sequence_nr + 1) {
      first_after = r.op;
    }
  }
  return spanning != 0 ? spanning : first_after;
}

void GraphCapture::FingerprintAtUse(uint64_t forward_thread, int64_t sequence_nr,
                                    EncodedRecords& out) {
  auto key = node_keys_.find({forward_thread, sequence_nr});
  if (key == node_keys_.end()) return;
  const auto* entry = ids_.FindNodeEntry(key->second.address);
  if (entry == nullptr || entry->id != key->second.id) return;
  compat::NodePtr node = entry->weak.lock();
  if (!node) return;
  const ObjectId id = entry->id;
  VisitSavedVariables(
      *node, [&](const char* name, uint32_t list_index, const torch::autograd::SavedVariable& sv) {
        if (!fingerprints_.enabled()) return;
        SavedVariableFacts facts = ReadSavedVariable(sv);
        if (facts.data == nullptr) return;
        fingerprints_.Queue(id, interner_.String(name, out), list_index, *facts.data, 0,
                            ids_.StorageId(*facts.data->unsafeGetTensorImpl()),
                            format::FingerprintWhen::kAtUse);
      });
}

namespace {

void ReadSavedHooksOf(torch::autograd::Node* node, SavedHooks& hooks) {
  if (node == nullptr) return;
  uint32_t index = 0;  // RecordSavedTensors visits in the same order: the NodeRecord's index.
  VisitSavedVariables(*node, [&](const char*, uint32_t, const torch::autograd::SavedVariable& sv) {
    if (ReadSavedVariable(sv).has_hooks) hooks.emplace_back(&sv, ReadSavedHook(*node, sv, index));
    ++index;
  });
}

}  // namespace

void ReadSavedHooks(const std::vector<OpOutput>& outputs, SavedHooks& hooks) {
  // Default hooks attach to what the ops inside the hooks' context save: none registered on this
  // thread, none packed by this op. (A node seen again at an enclosing op's end is read again;
  // the registry, which would know, needs the lock.)
  if (at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) return;
  for (const OpOutput& output : outputs) {
    const at::Tensor& t = *output.tensor;
    ReadSavedHooksOf(torch::autograd::impl::grad_fn_unsafe(t), hooks);
    if (!t.is_view()) continue;
    auto* view_meta = torch::autograd::impl::get_view_autograd_meta(t);
    if (view_meta != nullptr && view_meta->has_bw_view()) {
      ReadSavedHooksOf(
          torch::autograd::impl::grad_fn_unsafe(view_meta->get_backward_view().base_), hooks);
    }
  }
}

void NameSavedOutputs(NodeScratch& nodes, const std::vector<OpOutput>& outputs,
                      const std::vector<format::TensorUse>& uses) {
  for (format::NodeRecord& node : nodes) {
    for (auto& saved : node.saved) {
      if (saved.tensor != 0 || saved.version_counter == 0) continue;
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (outputs[i].version_counter == saved.version_counter &&
            outputs[i].storage == saved.storage) {
          saved.tensor = uses[i].tensor;
          break;
        }
      }
    }
  }
}

void ReadInputsUnchecked(c10::ArrayRef<const c10::IValue> inputs, ThreadState& ts) {
  ForEachInputTensor(inputs, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(t);
    if (grad_fn == nullptr || !IsPythonNode(typeid(*grad_fn))) return;
    const std::pair<const void*, uint64_t> key{grad_fn, grad_fn->sequence_nr()};
    if (std::find(ts.unchecked_read.begin(), ts.unchecked_read.end(), key) !=
        ts.unchecked_read.end()) {
      return;
    }
    ts.unchecked_read[ts.unchecked_read_next++ % ts.unchecked_read.size()] = key;
    std::vector<UncheckedTensor> tensors;
    ReadUncheckedTensors(*grad_fn, tensors);
    if (!tensors.empty()) ts.unchecked_saves.emplace_back(grad_fn, std::move(tensors));
  });
}

void ReadNodeSavedHooks(torch::autograd::Node* node, SavedHooks& hooks) {
  ReadSavedHooksOf(node, hooks);
}

}  // namespace torchrr::recorder
