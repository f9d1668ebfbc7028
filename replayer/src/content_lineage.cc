#include "content_lineage.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <string_view>

namespace torchrr::replayer {
namespace {

using format::ObjectId;

// Tags that keep the digests of different rules apart.
constexpr uint64_t kLeafTag = 0x6c656166;     // "leaf"
constexpr uint64_t kWriteTag = 0x7772697465;  // "write"
constexpr uint64_t kMadeTag = 0x6d616465;     // "made"

uint64_t Digest(const std::vector<uint64_t>& words) {
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t)) | 1;  // Never 0.
}

// Ops whose written arguments end up holding only what the op read (their earlier bytes do not
// matter). Copies into part of a tensor (index_copy_, masked_fill_) are not among them.
bool Overwrites(std::string_view name) {
  static constexpr std::array<std::string_view, 11> kOverwriting = {
      "aten::copy_",           "aten::_foreach_copy_",  "aten::_copy_from",
      "aten::_copy_from_and_resize", "aten::fill_",     "aten::zero_",
      "aten::_foreach_zero_",  "aten::split_with_sizes_copy", "aten::split_copy",
      "fsdp::split_with_sizes_copy", "fsdp::all_gather_copy_in"};
  return std::find(kOverwriting.begin(), kOverwriting.end(), name) != kOverwriting.end();
}

// Ops whose bytes are not a function of their arguments: every call makes bytes of its own.
// (An uninitialized buffer, `empty`, is not among them: what fills it decides, and a collective's
// receive buffer is filled by no op.)
bool MakesFreshBytes(std::string_view name) {
  for (std::string_view word : {"rand", "bernoulli", "normal", "uniform", "dropout", "multinomial",
                                "exponential", "geometric", "cauchy", "random"}) {
    if (name.find(word) != std::string_view::npos) return true;
  }
  return false;
}

// `text_hash`: the hash of v.s's text (ContentLineage::TraitsOf).
void AddValue(const format::Value& v, uint64_t text_hash, std::vector<uint64_t>& words) {
  words.push_back((uint64_t{v.position} << 8) | static_cast<uint8_t>(v.kind));
  words.push_back(static_cast<uint64_t>(v.i));
  words.push_back(std::bit_cast<uint64_t>(v.d));
  words.push_back(std::bit_cast<uint64_t>(v.d_imag));
  words.push_back(text_hash);
  words.push_back(v.ints.size());
  for (int64_t i : v.ints) words.push_back(static_cast<uint64_t>(i));
  words.push_back(v.doubles.size());
  for (double d : v.doubles) words.push_back(std::bit_cast<uint64_t>(d));
}

// A collective (c10d::allreduce_, c10d::_allgather_base_): what it writes is what every rank
// contributed, and the other ranks' bytes are not in this trace. Taken to be a function of this
// rank's contribution, which the buffer's lineage already holds, the write leaves it as it is; the
// backend's own copies into the buffer (gloo's, on its thread) are ops of their own.
bool IsCollective(std::string_view name) { return name.starts_with("c10d::"); }

bool Contains(const std::vector<ObjectId>& ids, ObjectId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

uint64_t ContentLineage::Of(ObjectId storage) const {
  if (storage == 0) return 0;
  const uint32_t slot = slots_.Find(storage, IdKind::kStorage);
  if (slot != IdIndex::kAbsent) return lineage_[slot];
  const std::array<uint64_t, 2> words = {kLeafTag, storage};
  return XXH3_64bits(words.data(), sizeof(words)) | 1;
}

void ContentLineage::Set(ObjectId storage, uint64_t lineage) {
  uint32_t slot = slots_.Find(storage, IdKind::kStorage);
  if (slot == IdIndex::kAbsent) {
    slot = static_cast<uint32_t>(lineage_.size());
    lineage_.push_back(lineage);
    slots_.Set(storage, IdKind::kStorage, slot);
    return;
  }
  lineage_[slot] = lineage;
}

// Dense (no gaps between its elements) over the storage's every byte, as the storage's size was
// last recorded; a storage recorded with no bytes (FSDP2 resizes a freed parameter's to 0) is
// taken as written in part.
bool ContentLineage::CoversItsStorage(const TensorState& tensor) const {
  const size_t item = DTypeSize(tensor.dtype);
  if (item == 0 || tensor.storage_nbytes == 0) return false;
  const auto [first, last] = state_.layouts.ByteRange(tensor.layout, tensor.storage_offset, item);
  return first == 0 && last >= tensor.storage_nbytes &&
         state_.layouts.Numel(tensor.layout) * item == last;
}

const ContentLineage::NameTraits& ContentLineage::TraitsOf(format::InternId id) {
  if (id >= traits_.size()) traits_.resize(id + 1);
  NameTraits& traits = traits_[id];
  if (traits.hash == 0) {
    const std::string& text = state_.Str(id);
    traits.hash = XXH3_64bits(text.data(), text.size()) | 1;
    traits.fresh = MakesFreshBytes(text);
    traits.collective = IsCollective(text);
    traits.overwrites = Overwrites(text);
  }
  return traits;
}

void ContentLineage::OnOp(const format::OpRecord& r) {
  if (r.inputs.empty() && r.outputs.empty()) return;
  read_storages_.clear();
  written_storages_.clear();
  written_whole_.clear();
  made_.clear();
  // A storage written through a tensor over all of its bytes loses what it held; written through
  // part of it, the rest stays.
  auto note = [&](const format::TensorUse& use, const TensorState& tensor, bool input) {
    const ObjectId storage = tensor.storage;
    if (use.version_after <= use.version_before) {
      if (input) read_storages_.push_back(storage);
      return;
    }
    const bool whole = CoversItsStorage(tensor);
    auto it = std::find(written_storages_.begin(), written_storages_.end(), storage);
    if (it == written_storages_.end()) {
      written_storages_.push_back(storage);
      written_whole_.push_back(whole);
    } else if (whole) {
      written_whole_[it - written_storages_.begin()] = true;
    }
  };
  for (const auto& use : r.inputs) {
    const TensorState* tensor = state_.FindTensor(use.tensor);
    if (tensor != nullptr && tensor->storage != 0) note(use, *tensor, true);
  }
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const TensorState* tensor = state_.FindTensor(r.outputs[k].tensor);
    if (tensor == nullptr || tensor->storage == 0) continue;
    // A storage first seen as an output is new, though its id may be a freed storage's (SPEC.md,
    // Ids): nothing the old one held carries over.
    if (!Contains(read_storages_, tensor->storage) &&
        !Contains(written_storages_, tensor->storage)) {
      made_.emplace_back(k, tensor->storage);
    }
    note(r.outputs[k], *tensor, false);
  }
  // Views and other ops that write nothing and make no storage leave every lineage as it was.
  if (written_storages_.empty() && made_.empty()) return;
  const NameTraits name = TraitsOf(r.name);  // A copy: TraitsOf may grow traits_.
  if (name.collective) return;
  // The op: what it is (by text: a trace may intern one name under several ids), its other
  // arguments, and what it read.
  scratch_.clear();
  scratch_.push_back(name.hash);
  scratch_.push_back(TraitsOf(r.overload).hash);
  if (name.fresh) scratch_.push_back(r.op);
  for (const auto& value : r.values) AddValue(value, TraitsOf(value.s).hash, scratch_);
  for (ObjectId storage : read_storages_) {
    // An argument that is also written was read before the write: its lineage goes in below.
    if (!Contains(written_storages_, storage)) scratch_.push_back(Of(storage));
  }
  const size_t op_words = scratch_.size();

  // Every written storage's new lineage starts from the old ones, read before any is replaced.
  old_.clear();
  for (ObjectId storage : written_storages_) old_.push_back(Of(storage));
  for (size_t i = 0; i < written_storages_.size(); ++i) {
    scratch_.resize(op_words);
    scratch_.push_back(kWriteTag);
    scratch_.push_back(i);
    if (!name.overwrites || !written_whole_[i]) {
      for (uint64_t lineage : old_) scratch_.push_back(lineage);
    }
    Set(written_storages_[i], Digest(scratch_));
  }
  for (const auto& [k, storage] : made_) {
    if (Contains(written_storages_, storage)) continue;
    scratch_.resize(op_words);
    scratch_.push_back(kMadeTag);
    scratch_.push_back(k);
    Set(storage, Digest(scratch_));
  }
}

}  // namespace torchrr::replayer
