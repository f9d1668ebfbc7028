// Writes into saved tensors' bytes that their version counters do not see; see silent_writes.h.
#include "silent_writes.h"

#include <algorithm>
#include <tuple>

namespace torchrr::replayer {
namespace {

using format::ObjectId;

// Appends `item` to a per-saved-tensor list kept in `list` (linked through Item::next).
template <typename Item>
void Append(std::vector<Item>& list, uint32_t& head, uint32_t& tail, Item item) {
  uint32_t index = static_cast<uint32_t>(list.size());
  list.push_back(item);
  if (tail == UINT32_MAX) {
    head = index;
  } else {
    list[tail].next = index;
  }
  tail = index;
}

}  // namespace

uint32_t& SilentWriteWatch::StorageHead(ObjectId storage) {
  uint32_t slot = state_.index.Find(storage, IdKind::kStorage);
  if (slot == IdIndex::kAbsent) {
    slot = static_cast<uint32_t>(storage_heads_.size());
    storage_heads_.push_back(UINT32_MAX);
    state_.index.Set(storage, IdKind::kStorage, slot);
  }
  return storage_heads_[slot];
}

void SilentWriteWatch::Watch(uint32_t node_slot) {
  NodeState& node = state_.nodes[node_slot];
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    uint32_t w = node.saved_begin + i;
    SavedState& s = state_.saved[w];
    const bool unchecked = IsUncheckedButKnown(s.saved);
    if (!(IsVersionChecked(s.saved) || unchecked) || s.bytes_storage == 0) continue;
    uint32_t& head = StorageHead(s.bytes_storage);
    s.watch_prev = UINT32_MAX;
    s.watch_next = head;
    if (head != UINT32_MAX) state_.saved[head].watch_prev = w;
    head = w;
    node.watched = true;
    // What backward takes unchecked (what a hook packed: the recomputation's tensors under
    // activation checkpointing) has no fingerprints; writes through another storage over its
    // bytes are watched from the save.
    if (unchecked && s.address_first != 0 && !s.address_watched) {
      s.address_watched = true;
      addressed_saved_.push_back(w);
    }
  }
}

void SilentWriteWatch::Unwatch(uint32_t node_slot) {
  NodeState& node = state_.nodes[node_slot];
  if (!node.watched) return;
  node.watched = false;
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    uint32_t w = node.saved_begin + i;
    SavedState& s = state_.saved[w];
    s.address_watched = false;  // Dropped from addressed_saved_ lazily.
    if (!(IsVersionChecked(s.saved) || IsUncheckedButKnown(s.saved)) || s.bytes_storage == 0) {
      continue;
    }
    if (s.watch_prev != UINT32_MAX) {
      state_.saved[s.watch_prev].watch_next = s.watch_next;
    } else {
      StorageHead(s.bytes_storage) = s.watch_next;
    }
    if (s.watch_next != UINT32_MAX) state_.saved[s.watch_next].watch_prev = s.watch_prev;
    s.watch_prev = s.watch_next = UINT32_MAX;
  }
}

// Calls visit(saved) for each watched saved tensor on `tensor`'s storage whose bytes overlap it.
template <typename Visit>
void SilentWriteWatch::ForEachOverlappingWatched(const TensorState& tensor, Visit&& visit) {
  if (tensor.storage == 0) return;
  uint32_t slot = state_.index.Find(tensor.storage, IdKind::kStorage);
  if (slot == IdIndex::kAbsent || storage_heads_[slot] == UINT32_MAX) return;
  auto [first, last] =
      state_.layouts.ByteRange(tensor.layout, tensor.storage_offset, DTypeSize(tensor.dtype));
  for (uint32_t w = storage_heads_[slot]; w != UINT32_MAX; w = state_.saved[w].watch_next) {
    SavedState& s = state_.saved[w];
    if (last <= s.byte_first || s.byte_last <= first) continue;
    visit(s);
  }
}

void SilentWriteWatch::OnWrite(ObjectId op, const TensorState& writer, ObjectId writer_counter) {
  ForEachOverlappingWatched(writer, [&](SavedState& s) {
    if (s.saved.version_counter == writer_counter) return;  // The version check sees it.
    Append(silent_writes_, s.silent_head, s.silent_tail, SilentWrite{op, state_.seq, UINT32_MAX});
  });
}

// Ops that wrote into a fingerprinted saved tensor's bytes, or made a tensor over them through
// which something outside the recorded ops could write (a view, detach(), numpy()).
void SilentWriteWatch::OnOp(const format::OpRecord& r) {
  if (fingerprinted_ == 0) return;
  auto visit = [&](const format::TensorUse& use, bool output) {
    bool wrote = use.version_after > use.version_before;
    if (!output && !wrote) return;
    const TensorState* tensor = state_.FindTensor(use.tensor);
    if (tensor == nullptr) return;
    ForEachOverlappingWatched(*tensor, [&](SavedState& s) {
      if (s.has_fingerprint && r.op != s.saved_by) AddTouch(s, r.op, wrote);
    });
  };
  for (const auto& use : r.inputs) visit(use, false);
  for (const auto& use : r.outputs) visit(use, true);
  if (!addressed_saved_.empty()) NoteWritesThroughOtherStorages(r);
}

// A write through a tensor whose storage is another one over the same memory (from_blob,
// DLPack: another StorageImpl, another counter) is a write into the saved bytes all the same.
// Needs the storages' addresses (--verify-saved traces).
void SilentWriteWatch::NoteWritesThroughOtherStorages(const format::OpRecord& r) {
  auto visit = [&](const format::TensorUse& use) {
    if (use.version_after <= use.version_before) return;
    const TensorState* tensor = state_.FindTensor(use.tensor);
    if (tensor == nullptr || tensor->storage_address == 0) return;
    auto [first, last] =
        state_.layouts.ByteRange(tensor->layout, tensor->storage_offset, DTypeSize(tensor->dtype));
    if (last == UINT64_MAX) return;
    const uint64_t address_first = tensor->storage_address + first;
    const uint64_t address_last = tensor->storage_address + last;
    for (uint32_t w : addressed_saved_) {
      SavedState& s = state_.saved[w];
      if (!s.address_watched || s.bytes_storage == tensor->storage) continue;
      if (address_last <= s.address_first || s.address_last <= address_first) continue;
      AddTouch(s, r.op, /*wrote=*/true);
    }
  };
  for (const auto& use : r.inputs) visit(use);
  for (const auto& use : r.outputs) visit(use);
  // Saved tensors whose nodes ran are dropped once they are most of the list.
  if (addressed_saved_.size() >= 2 * addressed_live_hint_ + 64) {
    std::erase_if(addressed_saved_,
                  [this](uint32_t w) { return !state_.saved[w].address_watched; });
    addressed_live_hint_ = addressed_saved_.size();
  }
}

void SilentWriteWatch::AddTouch(SavedState& s, ObjectId op, bool wrote) {
  if (s.touch_tail != UINT32_MAX && touches_[s.touch_tail].op == op) {
    touches_[s.touch_tail].wrote |= wrote;
    return;
  }
  Append(touches_, s.touch_head, s.touch_tail, StorageTouch{op, state_.seq, wrote, UINT32_MAX});
}

void SilentWriteWatch::OnFingerprint(const format::FingerprintRecord& r) {
  uint32_t node_slot = state_.index.Find(r.node, IdKind::kNode);
  if (node_slot == IdIndex::kAbsent) return;
  const NodeState& node = state_.nodes[node_slot];
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    SavedState& s = state_.saved[node.saved_begin + i];
    if (s.saved.name != r.saved_name || s.saved.list_index != r.list_index) continue;
    if (r.when == format::FingerprintWhen::kAtSave) {
      if (!s.has_fingerprint) ++fingerprinted_;
      if (s.address_first != 0 && !s.address_watched && node.watched) {
        s.address_watched = true;
        addressed_saved_.push_back(node.saved_begin + i);
      }
      s.has_fingerprint = true;
      s.hash_at_save = r.hash;
      s.save_ns = r.time_ns;
    } else if (s.has_fingerprint) {
      s.use_pending = true;
      s.hash_at_use = r.hash;
      s.use_ns = r.time_ns;
    }
    return;
  }
}

std::vector<ObjectId> SilentWriteWatch::SilentWritersBefore(const SavedState& s,
                                                            uint64_t seq) const {
  // A wrapper subclass's own in-place op (DTensor's mul_) writes the tensor it wraps inside it,
  // and moves the wrapper's counter: that write is the version check's, not a silent one.
  const CounterState* wrapper_counter = s.bytes_storage != s.saved.storage
                                            ? state_.FindCounter(s.saved.version_counter)
                                            : nullptr;
  auto inside_wrapper_write = [&](ObjectId op) {
    if (wrapper_counter == nullptr) return false;
    for (const Bump& b : wrapper_counter->bumps) {
      if (b.op != 0 && b.op != op && state_.IsDescendant(op, b.op)) return true;
    }
    return false;
  };
  std::vector<ObjectId> writers;
  for (uint32_t w = s.silent_head; w != UINT32_MAX; w = silent_writes_[w].next) {
    if (silent_writes_[w].seq >= seq) break;
    if (inside_wrapper_write(silent_writes_[w].op)) continue;
    writers.push_back(silent_writes_[w].op);
  }
  return writers;
}

std::vector<std::pair<ObjectId, bool>> SilentWriteWatch::TouchesBefore(const SavedState& s,
                                                                       uint64_t seq) const {
  std::vector<std::pair<ObjectId, bool>> touches;
  for (uint32_t t = s.touch_head; t != UINT32_MAX; t = touches_[t].next) {
    if (touches_[t].seq >= seq) break;
    touches.emplace_back(touches_[t].op, touches_[t].wrote);
  }
  return touches;
}

}  // namespace torchrr::replayer
