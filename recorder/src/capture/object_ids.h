// Stable ids for objects whose addresses get reused.
//
// The recorder names tensors, storages, version counters and autograd nodes by ids that never
// alias two different objects in one trace. Addresses alone would: memory is reused as soon as a
// tensor is freed. Each entry therefore holds a weak reference to its object, which keeps the
// object's memory (not the object) from being released, so its address cannot be reused while the
// entry exists; entries whose object died are swept when the table has doubled since the last
// sweep, after which the address may come back with a new id. Memory stays proportional to the
// live objects. A table made with a recheck distance also looks again at each entry that many
// insertions after it was made, and removes it if its object died: most tensors live for a few ops,
// and their memory then goes back to the allocator while it is still in the cache, instead of
// piling up until the next sweep. Generation() tells a caller that caches an id by address
// whether the entry there may have been removed since.
//
// A flat (open-addressing) table: one lookup costs a hash and a probe or two in one array, and a
// new entry no allocation of its own. An insertion may move entries: a reference Lookup() returns
// is valid until the next Lookup() on the same table.
//
// Not thread-safe: the caller holds the recorder's lock.
#ifndef TORCHRR_RECORDER_OBJECT_IDS_H_
#define TORCHRR_RECORDER_OBJECT_IDS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <c10/util/flat_hash_map.h>

#include "torchrr/format/records.h"

namespace torchrr::recorder {

// WeakRef must have expired() and be movable. Extra is per-entry state the caller keeps (for
// tensors: the last metadata written, to know when to write it again).
template <typename WeakRef, typename Extra = char>
class ObjectIdTable {
 public:
  // recheck: 0, or how many insertions after its own an entry is looked at again (see above).
  explicit ObjectIdTable(size_t recheck = 0) : recent_(recheck) {}

  struct Entry {
    WeakRef weak;
    format::ObjectId id = 0;
    Extra extra{};
  };

  // Returns the entry for the live object at `address`, creating it (with a fresh id from
  // `next_id`) when the address is new or its previous object died. `make_weak` is called only
  // when an entry is created. `created` says which.
  template <typename MakeWeak>
  Entry& Lookup(const void* address, MakeWeak&& make_weak, format::ObjectId& next_id,
                bool& created) {
    auto it = entries_.find(address);
    if (it != entries_.end() && !it->second.weak.expired()) {
      created = false;
      return it->second;
    }
    created = true;
    if (it != entries_.end()) {  // The old object died and its address went to a new one.
      ++removals_[Slot(address)];
      it->second = Entry{make_weak(), ++next_id, Extra{}};
      return it->second;
    }
    if (!recent_.empty()) Recheck(address);
    MaybeSweep();
    return entries_.emplace(address, Entry{make_weak(), ++next_id, Extra{}}).first->second;
  }

  // The id of a live object already in the table, or 0.
  format::ObjectId Find(const void* address) const {
    auto it = entries_.find(address);
    if (it == entries_.end() || it->second.weak.expired()) return 0;
    return it->second.id;
  }

  // The entry of a live object already in the table, or nullptr.
  const Entry* FindEntry(const void* address) const {
    auto it = entries_.find(address);
    if (it == entries_.end() || it->second.weak.expired()) return nullptr;
    return &it->second;
  }
  Entry* FindEntry(const void* address) {
    auto it = entries_.find(address);
    if (it == entries_.end() || it->second.weak.expired()) return nullptr;
    return &it->second;
  }

  // Forgets every entry's Extra (ids stay).
  void ResetExtras() {
    for (auto& [address, entry] : entries_) entry.extra = Extra{};
  }

  size_t size() const { return entries_.size(); }
  void Clear() {
    entries_.clear();
    std::fill(recent_.begin(), recent_.end(), nullptr);
    ++clears_;
  }

  // A number that changes whenever the entry at `address` may have been removed (a sweep, a
  // recheck, Clear(); addresses share counters, so it also changes for others). While it stays the
  // same, an address that had an entry still has that entry, with the same id, for as long as the
  // object there lives: the entry's weak reference keeps the address from going to another
  // object. Callers use it to cache ids: read it after the lookup whose id they keep.
  uint64_t Generation(const void* address) const { return removals_[Slot(address)] + clears_; }

  uint64_t sweeps() const { return sweeps_; }  // Full sweeps so far.

 private:
  void MaybeSweep() {
    if (entries_.size() < sweep_at_) return;
    ++sweeps_;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.weak.expired()) {
        ++removals_[Slot(it->first)];
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    sweep_at_ = std::max<size_t>(kMinSweep, 2 * entries_.size());
  }

  // Records `address` (about to be inserted) in the ring of recent insertions, and removes the
  // entry it replaces there if that entry's object died.
  void Recheck(const void* address) {
    const void* old = recent_[next_recent_];
    recent_[next_recent_] = address;
    next_recent_ = next_recent_ + 1 == recent_.size() ? 0 : next_recent_ + 1;
    // The next insertion's recheck reads that object's reference count (expired()): fetched now,
    // it is in the cache by then.
    if (const void* next = recent_[next_recent_]) __builtin_prefetch(next);
    if (old == nullptr) return;
    auto it = entries_.find(old);
    if (it != entries_.end() && it->second.weak.expired()) {
      ++removals_[Slot(old)];
      entries_.erase(it);
    }
  }

  static constexpr int kRemovalSlotBits = 10;
  static size_t Slot(const void* address) {
    uint64_t key = reinterpret_cast<uintptr_t>(address) * 0x9e3779b97f4a7c15ULL;
    return static_cast<size_t>(key >> (64 - kRemovalSlotBits));
  }

  static constexpr size_t kMinSweep = 1024;
  ska::flat_hash_map<const void*, Entry> entries_;
  size_t sweep_at_ = kMinSweep;
  uint64_t sweeps_ = 0;
  uint64_t clears_ = 0;
  // Removals per address slot (Generation).
  std::array<uint32_t, size_t{1} << kRemovalSlotBits> removals_{};
  std::vector<const void*> recent_;  // Ring of the last insertions' addresses (Recheck).
  size_t next_recent_ = 0;
};

// Ids by address for objects whose memory the recorder should not keep allocated: storages. A
// StorageImpl held by a weak reference after its tensors died stays allocated; glibc's allocator
// then cannot hand its block straight back to the next storage, which is made right after its
// data, and the heap of a CPU training step fills with free blocks that fit nothing, which the
// kernels pay for in page faults on fresh memory (docs/benchmarks.md, Heap). So an entry holds no
// reference by default, and its id names one object at a time: after the object is freed, the
// next one at its address gets its id.
//
// An entry can be pinned (LookupPinned: a saved tensor's storage, until the node that saved it
// runs): it then holds a weak reference, and once its object died the address gets a new id, so
// the id of an object that died pinned is never given again. The replayer watches a saved
// storage's id until its node runs, to the end of the trace when it never runs: an id given again
// would land in that watch. Pins are counted; Unpin() takes one back, and the last drops the
// reference. Pinned entries whose object died are swept when their count has doubled since the
// last sweep. A table that reaches max_entries addresses forgets its unpinned entries, so it stays
// small on long runs: those objects get new ids at their next use. Not thread-safe: the caller
// holds the recorder's lock.
template <typename WeakRef>
class AddressIdTable {
 public:
  explicit AddressIdTable(size_t max_entries) : max_entries_(max_entries) {}

  // The id of the object at `address`: new (from `next_id`) when the address is, or when the
  // object pinned there died.
  format::ObjectId Lookup(const void* address, format::ObjectId& next_id) {
    return Find(address, next_id).id;
  }

  // Lookup, and pins the entry once more (`make_weak` is called when it was not pinned).
  template <typename MakeWeak>
  format::ObjectId LookupPinned(const void* address, MakeWeak&& make_weak,
                                format::ObjectId& next_id) {
    Entry& entry = Find(address, next_id);
    const format::ObjectId id = entry.id;
    ++entry.pins;
    if (!entry.pin) {
      entry.pin.emplace(make_weak());
      ++pinned_;
      MaybeSweep();  // Keeps this entry: its object lives.
    }
    return id;
  }

  // Takes back one pin of the live object at `address` with id `id` (nothing if the entry is
  // another object's, or not pinned).
  void Unpin(const void* address, format::ObjectId id) {
    auto it = entries_.find(address);
    if (it == entries_.end()) return;
    Entry& entry = it->second;
    if (entry.id != id || !entry.pin || entry.pin->expired() || entry.pins == 0) return;
    if (--entry.pins == 0) {
      entry.pin.reset();
      --pinned_;
    }
  }

  // Changes whenever an address may have been given a new id (a pinned object's death, a sweep,
  // forgetting): a caller that caches an id by address reads it after the lookup whose id it
  // keeps.
  uint64_t Generation() const { return generation_; }

  void Clear() {
    entries_.clear();
    pinned_ = 0;
    ++generation_;
  }

 private:
  struct Entry {
    format::ObjectId id = 0;
    std::optional<WeakRef> pin;
    uint32_t pins = 0;
  };

  Entry& Find(const void* address, format::ObjectId& next_id) {
    auto it = entries_.find(address);
    if (it != entries_.end()) {
      Entry& entry = it->second;
      if (entry.pin && entry.pin->expired()) {  // A pinned object died: a new one is here.
        entry = Entry{++next_id, std::nullopt, 0};
        --pinned_;
        ++generation_;
      }
      return entry;
    }
    if (entries_.size() >= max_entries_) ForgetUnpinned();
    return entries_.emplace(address, Entry{++next_id, std::nullopt, 0}).first->second;
  }

  void MaybeSweep() {
    if (pinned_ < sweep_at_) return;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.pin && it->second.pin->expired()) {
        it = entries_.erase(it);
        --pinned_;
      } else {
        ++it;
      }
    }
    ++generation_;
    sweep_at_ = std::max<size_t>(kMinSweep, 2 * pinned_);
  }

  void ForgetUnpinned() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const bool live_pin = it->second.pin && !it->second.pin->expired();
      if (!live_pin) {
        if (it->second.pin) --pinned_;
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    ++generation_;
  }

  static constexpr size_t kMinSweep = 1024;
  const size_t max_entries_;
  ska::flat_hash_map<const void*, Entry> entries_;
  size_t pinned_ = 0;
  size_t sweep_at_ = kMinSweep;
  uint64_t generation_ = 0;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_OBJECT_IDS_H_
