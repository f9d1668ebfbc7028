// IdIndex: maps a trace's ObjectIds to slots in per-kind arrays.
//
// Ids come from one counter per trace in first-seen order, so they are dense: a plain array
// indexed by id costs 4 bytes per id and one load per lookup. Ids far past what the trace has shown
// so far (a corrupt trace, or an id space with holes) go to a hash map instead, so no input makes
// the array huge. Every kind of object shares the one index; the slot carries its kind, so an id a
// corrupt trace gives to two kinds is found only as the kind it was last set as.
#ifndef TORCHRR_REPLAYER_SRC_ID_INDEX_H_
#define TORCHRR_REPLAYER_SRC_ID_INDEX_H_

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::replayer {

enum class IdKind : uint32_t { kTensor = 1, kCounter = 2, kOp = 3, kNode = 4, kStorage = 5 };

class IdIndex {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  // The slot set for `id` as `kind`, or kAbsent.
  uint32_t Find(format::ObjectId id, IdKind kind) const {
    uint32_t packed = kEmpty;
    if (id < dense_.size()) {
      packed = dense_[id];
    } else if (!sparse_.empty()) {
      auto it = sparse_.find(id);
      if (it != sparse_.end()) packed = it->second;
    }
    if (packed == kEmpty || (packed >> kSlotBits) != static_cast<uint32_t>(kind)) return kAbsent;
    return packed & kSlotMask;
  }

  // Sets `id`'s slot. Slots must stay below 2^29 (500 million objects of one kind).
  void Set(format::ObjectId id, IdKind kind, uint32_t slot) {
    uint32_t packed = (static_cast<uint32_t>(kind) << kSlotBits) | (slot & kSlotMask);
    ++sets_;
    // Grown by the ids set, not by the largest: a trace's ids may skip ahead (a 655-byte trace of
    // doubling ids grew it to 1 GiB when each one could double it).
    if (id >= dense_.size() && id < kMaxDense && id <= 2 * sets_ + kSlack) Grow(id);
    if (id < dense_.size()) {
      dense_[id] = packed;
    } else {
      sparse_[id] = packed;
    }
  }

  // Entries of the dense part (for tests: its memory is 4 bytes each).
  size_t dense_size() const { return dense_.size(); }

 private:
  static constexpr uint32_t kSlotBits = 29;
  static constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
  static constexpr uint32_t kEmpty = UINT32_MAX;
  // 256 Mi ids (1 GiB of index) at most; past that, the hash map.
  static constexpr uint64_t kMaxDense = uint64_t{1} << 28;
  // Ids may run ahead of the ones looked up (ops, storages): allow holes of this size.
  static constexpr uint64_t kSlack = uint64_t{1} << 16;

  void Grow(format::ObjectId id) {
    uint64_t size = std::max<uint64_t>(id + 1, dense_.size() + dense_.size() / 2);
    dense_.resize(std::min<uint64_t>(size, kMaxDense), kEmpty);
    for (auto it = sparse_.begin(); it != sparse_.end();) {
      if (it->first < dense_.size()) {
        dense_[it->first] = it->second;
        it = sparse_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::vector<uint32_t> dense_;
  std::unordered_map<format::ObjectId, uint32_t> sparse_;
  uint64_t sets_ = 0;  // Set() calls: the dense part stays within a few times this.
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_ID_INDEX_H_
