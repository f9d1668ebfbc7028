// LayoutPool: shapes and strides, interned. Most tensors of a training step share a few layouts,
// so a tensor keeps a layout id and each layout is stored once. Not thread-safe: one analysis owns
// one pool.
#ifndef TORCHRR_REPLAYER_SRC_LAYOUT_POOL_H_
#define TORCHRR_REPLAYER_SRC_LAYOUT_POOL_H_

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchrr::replayer {

class LayoutPool {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // The layout's id; the same id for every equal shape and strides.
  uint32_t Intern(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
    uint64_t hash = 1469598103934665603ull ^ shape.size();
    auto mix = [&hash](int64_t v) { hash = (hash ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
    for (int64_t v : shape) mix(v);
    for (int64_t v : strides) mix(v ^ 0x5bd1e995);
    auto [it, inserted] = by_hash_.try_emplace(hash, kNone);
    for (uint32_t id = it->second; id != kNone; id = entries_[id].next) {
      if (Equal(id, shape, strides)) return id;
    }
    Entry entry{static_cast<uint32_t>(data_.size()), static_cast<uint32_t>(shape.size()),
                static_cast<uint32_t>(strides.size()), it->second};
    data_.insert(data_.end(), shape.begin(), shape.end());
    data_.insert(data_.end(), strides.begin(), strides.end());
    entries_.push_back(entry);
    it->second = static_cast<uint32_t>(entries_.size() - 1);
    return it->second;
  }

  // The number of elements of the layout's shape; 0 for kNone or an unknown id.
  uint64_t Numel(uint32_t id) const {
    if (id >= entries_.size()) return 0;
    const Entry& e = entries_[id];
    uint64_t numel = 1;
    for (uint32_t d = 0; d < e.ndim; ++d) {
      numel *= static_cast<uint64_t>(std::max<int64_t>(data_[e.offset + d], 0));
    }
    return numel;
  }

  // The layout's shape; empty for kNone or an unknown id.
  std::vector<int64_t> Shape(uint32_t id) const {
    if (id >= entries_.size()) return {};
    const Entry& e = entries_[id];
    return {data_.begin() + e.offset, data_.begin() + e.offset + e.ndim};
  }

  // The bytes [first, last) a tensor of this layout can touch, relative to its storage; empty
  // (first == last) for a tensor with no elements. Unknown strides: the contiguous extent.
  std::pair<uint64_t, uint64_t> ByteRange(uint32_t id, int64_t storage_offset,
                                          size_t item_size) const {
    if (id >= entries_.size() || item_size == 0) return {0, UINT64_MAX};
    const Entry& e = entries_[id];
    const int64_t* shape = data_.data() + e.offset;
    const int64_t* strides = shape + e.ndim;
    int64_t lo = 0, hi = 0, numel = 1;
    for (uint32_t d = 0; d < e.ndim; ++d) {
      if (shape[d] <= 0) return {0, 0};
      numel *= shape[d];
      int64_t stride = d < e.nstrides ? strides[d] : 0;
      if (e.nstrides != e.ndim) continue;
      if (stride >= 0) {
        hi += (shape[d] - 1) * stride;
      } else {
        lo += (shape[d] - 1) * stride;
      }
    }
    if (e.nstrides != e.ndim) hi = numel - 1;
    int64_t first = (storage_offset + lo) * static_cast<int64_t>(item_size);
    int64_t last = (storage_offset + hi + 1) * static_cast<int64_t>(item_size);
    return {static_cast<uint64_t>(std::max<int64_t>(first, 0)),
            static_cast<uint64_t>(std::max<int64_t>(last, 0))};
  }

 private:
  struct Entry {
    uint32_t offset;
    uint32_t ndim;
    uint32_t nstrides;
    uint32_t next;  // Next entry with the same hash.
  };

  bool Equal(uint32_t id, const std::vector<int64_t>& shape,
             const std::vector<int64_t>& strides) const {
    const Entry& e = entries_[id];
    if (e.ndim != shape.size() || e.nstrides != strides.size()) return false;
    const int64_t* p = data_.data() + e.offset;
    return std::equal(shape.begin(), shape.end(), p) &&
           std::equal(strides.begin(), strides.end(), p + e.ndim);
  }

  std::vector<int64_t> data_;
  std::vector<Entry> entries_;
  std::unordered_map<uint64_t, uint32_t> by_hash_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_LAYOUT_POOL_H_
