// The analysis behind `torchrr replay`; the contract is in torchrr/replayer/replayer.h.
//
// One pass over the records, in file order, keeping only what a later record can need:
//   - strings, frames, stacks (interned, small);
//   - per op: name, stack, parent, scope (to name culprits and victims and to walk nesting);
//   - per tensor: its latest metadata (shapes interned in a LayoutPool);
//   - per version counter: every in-place write (a Bump), in record order;
//   - per node: its edges and saved tensors (flat pools, no per-node allocation);
//   - the open backward pass.
//
// Time is record order ("seq", one tick per record). A node's version check happens at the start
// of its execution: the seq of the first record of the execution's op subtree (ops are written at
// their end, so the children of the backward op come before it).
#include <algorithm>
#include <array>
#include <cstring>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "id_index.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

using format::InternId;
using format::ObjectId;
using format::OpScope;

constexpr std::string_view kVersionErrorPhrase = "modified by an inplace operation";

// Ops the autograd engine wraps node executions in ("autograd::engine::evaluate_function: X"):
// neither forward ops nor the user's in-place calls.
bool IsAutogradEngineName(std::string_view name) { return name.starts_with("autograd::"); }

// Shapes and strides, interned: most tensors of a training step share a few layouts.
class LayoutPool {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

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

struct OpInfo {
  ObjectId parent = 0;
  InternId name = 0;
  InternId overload = 0;
  InternId stack = 0;
  uint32_t thread = 0;
  OpScope scope = OpScope::kFunction;
};

struct TensorState {
  ObjectId storage = 0;
  uint64_t storage_address = 0;  // Format 1.1, --verify-saved traces only.
  ObjectId counter = 0;
  ObjectId grad_fn = 0;
  int64_t storage_offset = 0;
  uint32_t layout = LayoutPool::kNone;
  uint32_t output_nr = 0;
  format::DType dtype = 0;
  format::Device device;
  bool is_leaf = true;
};

// One in-place write on a version counter, by the innermost op that showed it (the outermost
// user-called op is found at report time by walking up the parents). op 0: the counter moved
// between two recorded uses without a recorded write.
struct Bump {
  ObjectId op = 0;
  uint64_t seq = 0;
  uint32_t before = 0;
  uint32_t after = 0;
  ObjectId tensor = 0;  // The tensor written through (0 when the writer is unknown).
};

struct CounterState {
  bool seen = false;
  uint32_t first_version = 0;  // version_before at its first recorded use.
  uint32_t last_version = 0;   // Highest version seen so far.
  std::vector<Bump> bumps;     // In record order.
};

// A write into a saved tensor's bytes through a tensor with another version counter.
struct SilentWrite {
  ObjectId op = 0;
  uint64_t seq = 0;
  uint32_t next = UINT32_MAX;  // Next write into the same saved tensor.
};

struct SavedState {
  format::SavedTensor saved;
  // The tensor's metadata at save time (when known).
  bool meta_known = false;
  uint32_t layout = LayoutPool::kNone;
  format::DType dtype = 0;
  format::Device device;
  ObjectId grad_fn = 0;  // The tensor's grad_fn at save time.
  uint64_t byte_first = 0;
  uint64_t byte_last = UINT64_MAX;
  uint32_t silent_head = UINT32_MAX;
  uint32_t silent_tail = UINT32_MAX;
  // --verify-saved: the fingerprint of its bytes at save time and the one taken when backward was
  // about to use it (pending until that execution is checked).
  bool has_fingerprint = false;
  bool use_pending = false;
  ObjectId saved_by = 0;  // The op that created the node: its own record follows the save.
  // Where its bytes were in the recorded process (--verify-saved traces), [first, last); 0 when
  // unknown. `address_watched`: in addressed_saved_, until its node runs.
  uint64_t address_first = 0;
  uint64_t address_last = 0;
  bool address_watched = false;
  uint64_t hash_at_save = 0;
  uint64_t hash_at_use = 0;
  int64_t save_ns = 0;
  int64_t use_ns = 0;
  // Ops that wrote to or aliased its bytes since the save (fingerprinted saved tensors only).
  uint32_t touch_head = UINT32_MAX;
  uint32_t touch_tail = UINT32_MAX;
  // Links in its storage's list of watched saved tensors (Watch/Unwatch).
  uint32_t watch_prev = UINT32_MAX;
  uint32_t watch_next = UINT32_MAX;
};

struct NodeState {
  ObjectId id = 0;
  InternId name = 0;
  int64_t sequence_nr = -1;
  uint64_t forward_thread = 0;
  ObjectId created_by = 0;
  ObjectId variable = 0;
  format::SavedSetKind saved_kind = format::SavedSetKind::kExact;
  uint32_t edges_begin = 0, edges_count = 0;   // In edges_.
  uint32_t saved_begin = 0, saved_count = 0;   // In saved_.
  uint64_t last_pass = UINT64_MAX;             // Last backward pass that ran it.
  bool watched = false;                        // Its saved tensors are in their storages' lists.
};

// An op that wrote into, or made a tensor over, a fingerprinted saved tensor's bytes.
struct StorageTouch {
  ObjectId op = 0;
  uint64_t seq = 0;
  bool wrote = false;          // A version bump; otherwise it made an alias (a view, detach()).
  uint32_t next = UINT32_MAX;  // Next touch of the same saved tensor.
};

// A CUDA kernel, copy or memset launched outside any recorded op.
struct LooseKernel {
  InternId name = 0;           // 0 for copies and memsets.
  format::CudaCopyKind copy = format::CudaCopyKind::kUnknown;
  int8_t device = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// A violation as found, resolved into a Violation by BuildReport().
struct Finding {
  ViolationKind kind = ViolationKind::kVersion;
  uint32_t node = 0;    // Slot in nodes_.
  uint32_t saved = 0;   // Slot in saved_.
  uint32_t current_version = 0;
  std::vector<ObjectId> writers;  // Innermost ops, in order; 0 for an unrecorded write.
  bool simulated = false;
  uint64_t pass = 0;
  ObjectId exec_op = 0;
  bool exec_threw = false;
  // The saved tensor's grad_fn when the node ran (what PyTorch names for a saved input).
  ObjectId use_grad_fn = 0;
  bool view_regenerated = false;
  uint32_t use_output_nr = 0;
  bool use_known = false;
  // Silent writes found by fingerprints (--verify-saved).
  bool by_fingerprint = false;
  bool has_hashes = false;
  uint64_t hash_at_save = 0;
  uint64_t hash_at_use = 0;
  int64_t save_ns = 0;
  int64_t use_ns = 0;
  std::vector<std::pair<ObjectId, bool>> touches;  // (op, wrote), in order.
};

// A backward op or a NodeExecRecord waiting for its other half.
struct PendingExec {
  uint64_t start_seq = 0;   // First record of the op's subtree.
  uint64_t record_seq = 0;
  ObjectId node = 0;
  uint32_t thread = 0;
  bool threw = false;
  bool have_op = false;
  bool have_exec = false;
};

}  // namespace

class Analyzer::Impl {
 public:
  void Add(const format::Record& record) {
    if (finished_) return;
    ++seq_;
    std::visit([this](const auto& r) { On(r); }, record);
  }

  Report Finish() {
    if (finished_) return {};
    // Executions whose other half never came (a truncated trace): run them as they are.
    std::vector<std::pair<ObjectId, PendingExec>> pending(pending_execs_.begin(),
                                                          pending_execs_.end());
    std::sort(pending.begin(), pending.end(),
              [](const auto& a, const auto& b) { return a.second.record_seq < b.second.record_seq; });
    for (auto& [op, exec] : pending) {
      if (exec.have_exec) RunExec(op, exec);
    }
    pending_execs_.clear();
    EndPass();
    finished_ = true;
    return BuildReport();
  }

 private:
  // --- Interned definitions -------------------------------------------------------------------

  template <typename T>
  static void Put(std::vector<T>& table, uint32_t id, T value) {
    // 16 Mi entries: far more than any trace interns; a corrupt id past that is dropped.
    if (id == 0 || id >= (1u << 24)) return;
    if (id >= table.size()) table.resize(id + 1);
    table[id] = std::move(value);
  }

  const std::string& Str(InternId id) const {
    static const std::string kEmpty;
    return id < strings_.size() ? strings_[id] : kEmpty;
  }

  void On(const format::StringDef& r) { Put(strings_, r.id, r.text); }
  void On(const format::FrameDef& r) { Put(frames_, r.id, r); }
  void On(const format::StackDef& r) { Put(stacks_, r.id, r.frames); }

  // --- Tensors ---------------------------------------------------------------------------------

  void On(const format::TensorInfo& r) {
    uint32_t slot = index_.Find(r.tensor, IdKind::kTensor);
    if (slot == IdIndex::kAbsent) {
      slot = static_cast<uint32_t>(tensors_.size());
      tensors_.emplace_back();
      index_.Set(r.tensor, IdKind::kTensor, slot);
    }
    TensorState& t = tensors_[slot];
    t.storage = r.storage;
    t.storage_address = r.storage_address;
    t.counter = r.version_counter;
    t.grad_fn = r.grad_fn;
    t.storage_offset = r.storage_offset;
    t.layout = layouts_.Intern(r.shape, r.strides);
    t.output_nr = r.output_nr;
    t.dtype = r.dtype;
    t.device = r.device;
    t.is_leaf = r.is_leaf;
  }

  const TensorState* FindTensor(ObjectId id) const {
    uint32_t slot = index_.Find(id, IdKind::kTensor);
    return slot == IdIndex::kAbsent ? nullptr : &tensors_[slot];
  }

  CounterState* FindCounter(ObjectId id) {
    uint32_t slot = index_.Find(id, IdKind::kCounter);
    return slot == IdIndex::kAbsent ? nullptr : &counters_[slot];
  }

  CounterState& GetCounter(ObjectId id) {
    uint32_t slot = index_.Find(id, IdKind::kCounter);
    if (slot == IdIndex::kAbsent) {
      slot = static_cast<uint32_t>(counters_.size());
      counters_.emplace_back();
      index_.Set(id, IdKind::kCounter, slot);
    }
    return counters_[slot];
  }

  // --- Ops -------------------------------------------------------------------------------------

  const OpInfo* FindOp(ObjectId id) const {
    uint32_t slot = index_.Find(id, IdKind::kOp);
    return slot == IdIndex::kAbsent ? nullptr : &ops_[slot];
  }

  // True when `op` ran inside `ancestor` (following recorded parents).
  bool IsDescendant(ObjectId op, ObjectId ancestor) const {
    for (int depth = 0; op != 0 && depth < 256; ++depth) {
      if (op == ancestor) return true;
      const OpInfo* info = FindOp(op);
      if (info == nullptr) return false;
      op = info->parent;
    }
    return false;
  }

  void On(const format::OpRecord& r) {
    ++op_count_;
    uint32_t slot = static_cast<uint32_t>(ops_.size());
    ops_.push_back({r.parent, r.name, r.overload, r.stack, r.thread, r.scope});
    index_.Set(r.op, IdKind::kOp, slot);
    if (r.scope == OpScope::kFunction && r.sequence_nr >= 0) {
      recent_sequenced_ops_[recent_next_++ % kRecentSequencedOps] = {r.thread, r.sequence_nr, r.op};
    }

    // The first record of this op's subtree; handed up to the parent, still open.
    uint64_t subtree_first = seq_;
    if (r.parent != 0 || !open_ops_.empty()) {
      auto& open = OpenOps(r.thread);
      // Entries of ops that never ended (a truncated subtree) are dropped on the way.
      while (!open.empty() && open.back().first != r.op && open.back().first != r.parent &&
             FindOp(open.back().first) != nullptr) {
        open.pop_back();
      }
      if (!open.empty() && open.back().first == r.op) {
        subtree_first = std::min(subtree_first, open.back().second);
        open.pop_back();
      }
      if (r.parent != 0) {
        if (!open.empty() && open.back().first == r.parent) {
          open.back().second = std::min(open.back().second, subtree_first);
        } else {
          open.emplace_back(r.parent, subtree_first);
        }
      }
    }

    TrackVersions(r);
    if (fingerprinted_ != 0) NoteStorageTouches(r);

    if (r.scope == OpScope::kBackwardFunction) {
      PendingExec& exec = pending_execs_[r.op];
      exec.start_seq = subtree_first;
      exec.have_op = true;
      if (!exec.have_exec) exec.record_seq = seq_;
      if (exec.have_exec) {
        PendingExec done = exec;
        pending_execs_.erase(r.op);
        RunExec(r.op, done);
      }
      return;
    }
    NoteForwardOp(r);
  }

  std::vector<std::pair<ObjectId, uint64_t>>& OpenOps(uint32_t thread) {
    if (open_ops_cache_ == nullptr || open_ops_thread_ != thread) {
      open_ops_cache_ = &open_ops_[thread];
      open_ops_thread_ = thread;
    }
    return *open_ops_cache_;
  }

  // Versions: every tensor use tells the counter's value at the op's start and end.
  void TrackVersions(const format::OpRecord& r) {
    seen_counters_.clear();
    auto visit = [&](const format::TensorUse& use) {
      const TensorState* tensor = FindTensor(use.tensor);
      if (tensor == nullptr || tensor->counter == 0) return;
      ObjectId counter_id = tensor->counter;
      if (std::find(seen_counters_.begin(), seen_counters_.end(), counter_id) !=
          seen_counters_.end()) {
        return;
      }
      seen_counters_.push_back(counter_id);
      CounterState& counter = GetCounter(counter_id);
      if (!counter.seen) {
        counter.seen = true;
        counter.first_version = use.version_before;
        counter.last_version = use.version_before;
      } else if (use.version_before > counter.last_version) {
        // Moved between two recorded uses, by nothing recorded (or by an op still running on
        // another thread: RecordBump replaces this entry when that op ends).
        counter.bumps.push_back({0, seq_, counter.last_version, use.version_before, 0});
      }
      if (use.version_after > use.version_before) {
        RecordBump(counter, r, use.version_before, use.version_after, *tensor, use.tensor,
                   counter_id);
      }
      counter.last_version = std::max(counter.last_version, use.version_after);
    };
    for (const auto& use : r.inputs) visit(use);
    for (const auto& use : r.outputs) visit(use);
  }

  void RecordBump(CounterState& counter, const format::OpRecord& r, uint32_t before,
                  uint32_t after, const TensorState& tensor, ObjectId tensor_id,
                  ObjectId counter_id) {
    auto& bumps = counter.bumps;
    // A nested op showed this write already: the innermost op keeps it.
    if (!bumps.empty() && bumps.back().op != 0 && bumps.back().after >= after &&
        IsDescendant(bumps.back().op, r.op)) {
      return;
    }
    if (!bumps.empty() && bumps.back().op != 0 && bumps.back().after > before &&
        IsDescendant(bumps.back().op, r.op)) {
      before = bumps.back().after;
    }
    // Writes seen as gaps before this op ended were this op's.
    while (!bumps.empty() && bumps.back().op == 0 && bumps.back().before >= before &&
           bumps.back().after <= after) {
      bumps.pop_back();
    }
    bumps.push_back({r.op, seq_, before, after, tensor_id});
    ++bump_count_;
    CheckSilentWrite(r.op, tensor, counter_id);
  }

  // Forward evidence for the pass rule (see NewPassNeeded).
  void NoteForwardOp(const format::OpRecord& r) {
    if (!pass_open_ || forward_seen_) return;
    if (r.scope == OpScope::kBackwardFunction || IsAutogradEngineName(Str(r.name))) return;
    if (r.parent == 0) {
      forward_seen_ = true;
    } else {
      candidates_.push_back({r.op, r.thread});
    }
  }

  // --- Nodes and their saved tensors ------------------------------------------------------------

  // A node the recorder found only later, through another node's edges (a Python
  // torch.autograd.Function's node is attached after its forward ran): the recent forward op that
  // carried the node's sequence number on its thread created it.
  ObjectId CreatorBySequence(const format::NodeRecord& r) const {
    if (r.sequence_nr < 0) return 0;
    size_t n = std::min<uint64_t>(recent_next_, kRecentSequencedOps);
    for (size_t i = 1; i <= n; ++i) {
      const SequencedOp& op = recent_sequenced_ops_[(recent_next_ - i) % kRecentSequencedOps];
      if (op.sequence_nr == r.sequence_nr && op.thread == r.forward_thread) return op.op;
    }
    return 0;
  }

  void On(const format::NodeRecord& r) {
    if (index_.Find(r.node, IdKind::kNode) != IdIndex::kAbsent) return;  // First sight wins.
    NodeState node;
    node.id = r.node;
    node.name = r.name;
    node.sequence_nr = r.sequence_nr;
    node.forward_thread = r.forward_thread;
    node.created_by = r.created_by != 0 ? r.created_by : CreatorBySequence(r);
    node.variable = r.variable;
    node.saved_kind = r.saved_kind;
    node.edges_begin = static_cast<uint32_t>(edges_.size());
    for (const auto& edge : r.edges) {
      if (edge.node != 0) edges_.push_back(edge.node);
    }
    node.edges_count = static_cast<uint32_t>(edges_.size()) - node.edges_begin;
    node.saved_begin = static_cast<uint32_t>(saved_.size());
    for (const auto& saved : r.saved) {
      SavedState s;
      s.saved = saved;
      s.saved_by = r.created_by;
      if (const TensorState* t = FindTensor(saved.tensor)) {
        s.meta_known = true;
        s.grad_fn = t->grad_fn;
        s.layout = t->layout;
        s.dtype = t->dtype;
        s.device = t->device;
        std::tie(s.byte_first, s.byte_last) =
            layouts_.ByteRange(t->layout, t->storage_offset, DTypeSize(t->dtype));
        if (t->storage_address != 0 && s.byte_last != UINT64_MAX) {
          s.address_first = t->storage_address + s.byte_first;
          s.address_last = t->storage_address + s.byte_last;
        }
      }
      saved_.push_back(std::move(s));
    }
    node.saved_count = static_cast<uint32_t>(saved_.size()) - node.saved_begin;
    if (r.saved_kind == format::SavedSetKind::kUnknown) ++unknown_saved_nodes_[r.name];
    uint32_t slot = static_cast<uint32_t>(nodes_.size());
    nodes_.push_back(node);
    index_.Set(r.node, IdKind::kNode, slot);
    Watch(slot);
  }

  static bool Checked(const format::SavedTensor& s) { return s.defined && !s.has_hooks; }

  // Silent writes: the saved tensors' storages are watched from the save to the node's run. Each
  // storage has an intrusive list of its watched saved tensors (head in storage_heads_), so
  // watching and unwatching allocate nothing.
  uint32_t& StorageHead(ObjectId storage) {
    uint32_t slot = index_.Find(storage, IdKind::kStorage);
    if (slot == IdIndex::kAbsent) {
      slot = static_cast<uint32_t>(storage_heads_.size());
      storage_heads_.push_back(UINT32_MAX);
      index_.Set(storage, IdKind::kStorage, slot);
    }
    return storage_heads_[slot];
  }

  void Watch(uint32_t node_slot) {
    NodeState& node = nodes_[node_slot];
    for (uint32_t i = 0; i < node.saved_count; ++i) {
      uint32_t w = node.saved_begin + i;
      SavedState& s = saved_[w];
      if (!Checked(s.saved) || s.saved.storage == 0) continue;
      uint32_t& head = StorageHead(s.saved.storage);
      s.watch_prev = UINT32_MAX;
      s.watch_next = head;
      if (head != UINT32_MAX) saved_[head].watch_prev = w;
      head = w;
      node.watched = true;
    }
  }

  void Unwatch(uint32_t node_slot) {
    NodeState& node = nodes_[node_slot];
    if (!node.watched) return;
    node.watched = false;
    for (uint32_t i = 0; i < node.saved_count; ++i) {
      uint32_t w = node.saved_begin + i;
      SavedState& s = saved_[w];
      s.address_watched = false;  // Dropped from addressed_saved_ lazily.
      if (!Checked(s.saved) || s.saved.storage == 0) continue;
      if (s.watch_prev != UINT32_MAX) {
        saved_[s.watch_prev].watch_next = s.watch_next;
      } else {
        StorageHead(s.saved.storage) = s.watch_next;
      }
      if (s.watch_next != UINT32_MAX) saved_[s.watch_next].watch_prev = s.watch_prev;
      s.watch_prev = s.watch_next = UINT32_MAX;
    }
  }

  // Calls visit(saved) for each watched saved tensor on `tensor`'s storage whose bytes overlap it.
  template <typename Visit>
  void ForEachOverlappingWatched(const TensorState& tensor, Visit&& visit) {
    if (tensor.storage == 0) return;
    uint32_t slot = index_.Find(tensor.storage, IdKind::kStorage);
    if (slot == IdIndex::kAbsent || storage_heads_[slot] == UINT32_MAX) return;
    auto [first, last] =
        layouts_.ByteRange(tensor.layout, tensor.storage_offset, DTypeSize(tensor.dtype));
    for (uint32_t w = storage_heads_[slot]; w != UINT32_MAX; w = saved_[w].watch_next) {
      SavedState& s = saved_[w];
      if (last <= s.byte_first || s.byte_last <= first) continue;
      visit(s);
    }
  }

  // Appends `item` to a per-saved-tensor list kept in `list` (linked through Item::next).
  template <typename Item>
  static void Append(std::vector<Item>& list, uint32_t& head, uint32_t& tail, Item item) {
    uint32_t index = static_cast<uint32_t>(list.size());
    list.push_back(item);
    if (tail == UINT32_MAX) {
      head = index;
    } else {
      list[tail].next = index;
    }
    tail = index;
  }

  void CheckSilentWrite(ObjectId op, const TensorState& writer, ObjectId writer_counter) {
    ForEachOverlappingWatched(writer, [&](SavedState& s) {
      if (s.saved.version_counter == writer_counter) return;  // The version check sees it.
      Append(silent_writes_, s.silent_head, s.silent_tail, SilentWrite{op, seq_, UINT32_MAX});
    });
  }

  // --- Backward -------------------------------------------------------------------------------

  void On(const format::NodeExecRecord& r) {
    PendingExec& exec = pending_execs_[r.op];
    exec.node = r.node;
    exec.thread = r.thread;
    exec.threw = r.threw;
    exec.have_exec = true;
    if (!exec.have_op) exec.record_seq = exec.start_seq = seq_;
    if (exec.have_op) {
      PendingExec done = exec;
      pending_execs_.erase(r.op);
      RunExec(r.op, done);
    }
  }

  // The pass rule. A node execution starts a new backward pass when
  //   - no pass is open, or the open one threw (PyTorch abandons a pass at its first error);
  //   - forward work ran since the pass's last execution: a top-level op (parent 0) that is
  //     neither a backward function nor an autograd engine wrapper, or a nested op whose chain of
  //     parents reaches no backward function (on the executing thread, or on a thread that ran no
  //     node of this pass, since a thread running nodes has backward ops still open);
  //   - the node already ran in the open pass (backward twice over a retained graph).
  bool NewPassNeeded(uint32_t node_slot, ObjectId exec_op, uint32_t thread) {
    if (!pass_open_ || pass_threw_ || forward_seen_) return true;
    if (node_slot != IdIndex::kAbsent && nodes_[node_slot].last_pass == pass_index_) return true;
    bool forward = false;
    std::vector<Candidate> keep;
    for (const Candidate& c : candidates_) {
      bool same_thread = c.thread == thread;
      bool busy_thread = !same_thread && std::find(pass_threads_.begin(), pass_threads_.end(),
                                                   c.thread) != pass_threads_.end();
      switch (Classify(c.op, exec_op)) {
        case Chain::kForward:
          forward = true;
          break;
        case Chain::kOpen:
          if (busy_thread) {
            keep.push_back(c);
          } else {
            forward = true;
          }
          break;
        case Chain::kBackward:
          break;
      }
      if (forward) break;
    }
    candidates_ = std::move(keep);
    return forward;
  }

  enum class Chain { kForward, kBackward, kOpen };

  Chain Classify(ObjectId op, ObjectId exec_op) const {
    const OpInfo* info = FindOp(op);
    for (int depth = 0; info != nullptr && depth < 256; ++depth) {
      ObjectId parent = info->parent;
      if (parent == 0) return Chain::kForward;
      if (parent == exec_op) return Chain::kBackward;
      info = FindOp(parent);
      if (info == nullptr) return Chain::kOpen;
      if (info->scope == OpScope::kBackwardFunction || IsAutogradEngineName(Str(info->name))) {
        return Chain::kBackward;
      }
    }
    return Chain::kOpen;
  }

  void RunExec(ObjectId exec_op, const PendingExec& exec) {
    ++exec_count_;
    uint32_t slot = index_.Find(exec.node, IdKind::kNode);
    if (NewPassNeeded(slot, exec_op, exec.thread)) {
      EndPass();
      pass_open_ = true;
      pass_index_ = pass_count_++;
      pass_root_ = slot;
    }
    forward_seen_ = false;
    candidates_.clear();
    if (std::find(pass_threads_.begin(), pass_threads_.end(), exec.thread) == pass_threads_.end()) {
      pass_threads_.push_back(exec.thread);
    }
    if (slot == IdIndex::kAbsent) {
      // Node 0: the recorder could not tell which node ran (a backward called outside autograd's
      // engine; recorders before 2026-11-30 also wrote 0 for AccumulateGrad and GraphRoot, which
      // save nothing): there is nothing to check.
      if (exec.node != 0) ++unknown_node_execs_;
    } else {
      if (pass_root_ == IdIndex::kAbsent) pass_root_ = slot;
      nodes_[slot].last_pass = pass_index_;
      pass_executed_.push_back(slot);
      CheckNode(slot, exec.start_seq, /*simulated=*/false, exec_op, exec.threw);
      Unwatch(slot);
    }
    if (exec.threw) {
      pass_threw_ = true;
      pass_stop_seq_ = exec.record_seq;
      threw_execs_.insert(exec_op);
    }
  }

  // The counter's version just before record `seq`.
  uint32_t VersionAt(const CounterState& counter, uint64_t seq, uint32_t fallback) const {
    auto it = std::lower_bound(counter.bumps.begin(), counter.bumps.end(), seq,
                               [](const Bump& b, uint64_t s) { return b.seq < s; });
    if (it != counter.bumps.begin()) return std::prev(it)->after;
    return counter.seen ? counter.first_version : fallback;
  }

  // autograd's SavedVariable::unpack check for every saved tensor of the node, at record `seq`.
  void CheckNode(uint32_t node_slot, uint64_t seq, bool simulated, ObjectId exec_op, bool threw) {
    const NodeState& node = nodes_[node_slot];
    for (uint32_t i = 0; i < node.saved_count; ++i) {
      uint32_t saved_slot = node.saved_begin + i;
      SavedState& s = saved_[saved_slot];
      if (!Checked(s.saved)) continue;
      const size_t findings_before = findings_.size();
      Finding base;
      base.node = node_slot;
      base.saved = saved_slot;
      base.simulated = simulated;
      base.pass = pass_index_;
      base.exec_op = exec_op;
      base.exec_threw = threw;
      base.current_version = s.saved.saved_version;
      if (const TensorState* t = FindTensor(s.saved.tensor)) {
        base.use_known = true;
        base.use_grad_fn = t->is_leaf ? 0 : t->grad_fn;
        base.use_output_nr = t->output_nr;
      }
      if (const CounterState* counter = FindCounterConst(s.saved.version_counter)) {
        uint32_t current = VersionAt(*counter, seq, s.saved.saved_version);
        if (current != s.saved.saved_version) {
          Finding f = base;
          f.kind = ViolationKind::kVersion;
          f.current_version = current;
          const Bump* last = nullptr;
          for (const Bump& b : counter->bumps) {
            if (b.seq >= seq) break;
            if (b.after > s.saved.saved_version) f.writers.push_back(b.op);
            last = &b;
          }
          // A view written through another tensor sharing its counter (its base or another
          // view) keeps a stale grad_fn: PyTorch regenerates it as AsStridedBackward0 when it
          // raises, and names that. (A base written through a view got CopySlices instead,
          // which the trace shows as a changed grad_fn.)
          f.view_regenerated = f.use_known && f.use_grad_fn != 0 && s.meta_known &&
                               f.use_grad_fn == s.grad_fn && last != nullptr &&
                               last->tensor != 0 && last->tensor != s.saved.tensor;
          findings_.push_back(std::move(f));
        }
      }
      if (s.silent_head != UINT32_MAX && silent_writes_[s.silent_head].seq < seq) {
        Finding f = base;
        f.kind = ViolationKind::kSilent;
        for (uint32_t w = s.silent_head; w != UINT32_MAX; w = silent_writes_[w].next) {
          if (silent_writes_[w].seq >= seq) break;
          f.writers.push_back(silent_writes_[w].op);
        }
        findings_.push_back(std::move(f));
      }
      if (!simulated && s.use_pending) CheckFingerprint(s, base, seq, findings_before);
    }
  }

  // --verify-saved: bytes that changed between the save and this use. A change that a finding
  // above already explains (a version bump, a write through .data) only adds the hashes to it;
  // an unexplained one is a silent write by something the recorder could not see.
  void CheckFingerprint(SavedState& s, const Finding& base, uint64_t seq, size_t findings_before) {
    s.use_pending = false;
    if (s.hash_at_use == s.hash_at_save) return;
    auto add_hashes = [&](Finding& f) {
      f.has_hashes = true;
      f.hash_at_save = s.hash_at_save;
      f.hash_at_use = s.hash_at_use;
      f.save_ns = s.save_ns;
      f.use_ns = s.use_ns;
    };
    if (findings_.size() > findings_before) {
      for (size_t i = findings_before; i < findings_.size(); ++i) add_hashes(findings_[i]);
      return;
    }
    Finding f = base;
    f.kind = ViolationKind::kSilent;
    f.by_fingerprint = true;
    add_hashes(f);
    for (uint32_t t = s.touch_head; t != UINT32_MAX; t = touches_[t].next) {
      if (touches_[t].seq >= seq) break;
      f.touches.emplace_back(touches_[t].op, touches_[t].wrote);
    }
    findings_.push_back(std::move(f));
  }

  const CounterState* FindCounterConst(ObjectId id) const {
    if (id == 0) return nullptr;
    uint32_t slot = index_.Find(id, IdKind::kCounter);
    return slot == IdIndex::kAbsent ? nullptr : &counters_[slot];
  }

  bool IsAccumulateGrad(const NodeState& node) const {
    return node.variable != 0 || node.sequence_nr == INT64_MAX ||
           Str(node.name).find("AccumulateGrad") != std::string::npos;
  }

  // Closes the open pass. When it threw, runs the rest of it as autograd would have: the nodes
  // reachable from its root, each once all its consumers in that graph ran, highest sequence_nr
  // first (AccumulateGrad first of all), each checked as of the moment the pass stopped.
  void EndPass() {
    if (pass_open_ && pass_threw_ && pass_root_ != IdIndex::kAbsent) SimulateRest();
    pass_open_ = false;
    pass_threw_ = false;
    forward_seen_ = false;
    pass_root_ = IdIndex::kAbsent;
    pass_executed_.clear();
    pass_threads_.clear();
    candidates_.clear();
  }

  void SimulateRest() {
    std::unordered_map<uint32_t, uint32_t> local;  // Node slot -> index in graph.
    std::vector<uint32_t> graph{pass_root_};
    local.emplace(pass_root_, 0);
    for (size_t i = 0; i < graph.size(); ++i) {
      const NodeState& node = nodes_[graph[i]];
      for (uint32_t e = 0; e < node.edges_count; ++e) {
        uint32_t next = index_.Find(edges_[node.edges_begin + e], IdKind::kNode);
        if (next == IdIndex::kAbsent) continue;
        if (local.try_emplace(next, static_cast<uint32_t>(graph.size())).second) {
          graph.push_back(next);
        }
      }
    }
    std::vector<uint32_t> pending_inputs(graph.size(), 0);
    std::vector<bool> ran(graph.size(), false);
    for (uint32_t slot : graph) {
      const NodeState& node = nodes_[slot];
      for (uint32_t e = 0; e < node.edges_count; ++e) {
        auto it = local.find(index_.Find(edges_[node.edges_begin + e], IdKind::kNode));
        if (it != local.end()) ++pending_inputs[it->second];
      }
    }
    auto priority = [this, &graph](uint32_t a, uint32_t b) {  // True when b runs first.
      const NodeState& na = nodes_[graph[a]];
      const NodeState& nb = nodes_[graph[b]];
      bool acc_a = IsAccumulateGrad(na), acc_b = IsAccumulateGrad(nb);
      if (acc_a != acc_b) return acc_b;
      if (na.sequence_nr != nb.sequence_nr) return na.sequence_nr < nb.sequence_nr;
      return na.id > nb.id;
    };
    std::priority_queue<uint32_t, std::vector<uint32_t>, decltype(priority)> ready(priority);
    auto finish = [&](uint32_t g) {
      ran[g] = true;
      const NodeState& node = nodes_[graph[g]];
      for (uint32_t e = 0; e < node.edges_count; ++e) {
        auto it = local.find(index_.Find(edges_[node.edges_begin + e], IdKind::kNode));
        if (it == local.end()) continue;
        if (--pending_inputs[it->second] == 0 && !ran[it->second]) ready.push(it->second);
      }
    };
    std::vector<bool> executed(graph.size(), false);
    for (uint32_t slot : pass_executed_) {
      if (auto it = local.find(slot); it != local.end()) executed[it->second] = true;
    }
    for (uint32_t slot : pass_executed_) {
      auto it = local.find(slot);
      if (it != local.end() && !ran[it->second]) finish(it->second);
    }
    while (!ready.empty()) {
      uint32_t g = ready.top();
      ready.pop();
      if (ran[g] || executed[g]) continue;
      CheckNode(graph[g], pass_stop_seq_, /*simulated=*/true, 0, false);
      finish(g);
    }
  }

  // --- Errors and the rest ---------------------------------------------------------------------

  void On(const format::ErrorRecord& r) {
    if (r.message.find(kVersionErrorPhrase) == std::string::npos) return;
    if (r.kind == format::ErrorKind::kCppException && r.op != 0) {
      op_errors_.emplace_back(r.op, r.message);
    } else if (r.kind != format::ErrorKind::kRecorder) {
      final_error_ = r.message;
    }
  }

  void On(const format::DataLossRecord& r) {
    ++data_loss_records_;
    data_lost_ += r.records;
  }

  // Kernels inside ops are the ops' work; those outside any op are candidates for silent writes.
  void On(const format::CudaKernelRecord& r) {
    if (r.op == 0) AddLooseKernel({r.name, format::CudaCopyKind::kUnknown, r.device, r.start_ns,
                                   r.end_ns});
  }
  void On(const format::CudaMemcpyRecord& r) {
    if (r.op == 0) AddLooseKernel({0, r.kind, r.device, r.start_ns, r.end_ns});
  }
  void AddLooseKernel(const LooseKernel& kernel) {
    // 1 Mi: a bound on memory for a trace full of raw launches; later ones are not candidates.
    if (loose_kernels_.size() < (1u << 20)) loose_kernels_.push_back(kernel);
  }

  void On(const format::FingerprintRecord& r) {
    uint32_t node_slot = index_.Find(r.node, IdKind::kNode);
    if (node_slot == IdIndex::kAbsent) return;
    const NodeState& node = nodes_[node_slot];
    for (uint32_t i = 0; i < node.saved_count; ++i) {
      SavedState& s = saved_[node.saved_begin + i];
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

  // Ops that wrote into a fingerprinted saved tensor's bytes, or made a tensor over them through
  // which something outside the recorded ops could write (a view, detach(), numpy()).
  void NoteStorageTouches(const format::OpRecord& r) {
    auto visit = [&](const format::TensorUse& use, bool output) {
      bool wrote = use.version_after > use.version_before;
      if (!output && !wrote) return;
      const TensorState* tensor = FindTensor(use.tensor);
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
  void NoteWritesThroughOtherStorages(const format::OpRecord& r) {
    auto visit = [&](const format::TensorUse& use) {
      if (use.version_after <= use.version_before) return;
      const TensorState* tensor = FindTensor(use.tensor);
      if (tensor == nullptr || tensor->storage_address == 0) return;
      auto [first, last] =
          layouts_.ByteRange(tensor->layout, tensor->storage_offset, DTypeSize(tensor->dtype));
      if (last == UINT64_MAX) return;
      const uint64_t address_first = tensor->storage_address + first;
      const uint64_t address_last = tensor->storage_address + last;
      for (uint32_t w : addressed_saved_) {
        SavedState& s = saved_[w];
        if (!s.address_watched || s.saved.storage == tensor->storage) continue;
        if (address_last <= s.address_first || s.address_last <= address_first) continue;
        AddTouch(s, r.op, /*wrote=*/true);
      }
    };
    for (const auto& use : r.inputs) visit(use);
    for (const auto& use : r.outputs) visit(use);
    // Saved tensors whose nodes ran are dropped once they are most of the list.
    if (addressed_saved_.size() >= 2 * addressed_live_hint_ + 64) {
      std::erase_if(addressed_saved_, [this](uint32_t w) { return !saved_[w].address_watched; });
      addressed_live_hint_ = addressed_saved_.size();
    }
  }

  void AddTouch(SavedState& s, ObjectId op, bool wrote) {
    if (s.touch_tail != UINT32_MAX && touches_[s.touch_tail].op == op) {
      touches_[s.touch_tail].wrote |= wrote;
      return;
    }
    Append(touches_, s.touch_head, s.touch_tail, StorageTouch{op, seq_, wrote, UINT32_MAX});
  }

  // --- The report ------------------------------------------------------------------------------

  std::vector<Frame> StackFrames(InternId stack) const {
    std::vector<Frame> frames;
    if (stack == 0 || stack >= stacks_.size()) return frames;
    for (InternId id : stacks_[stack]) {
      Frame frame;
      if (id < frames_.size() && frames_[id].id != 0) {
        const format::FrameDef& f = frames_[id];
        frame.function = Str(f.function);
        frame.file = Str(f.file);
        frame.line = f.line;
        frame.library = Str(f.library);
        frame.python = f.kind == format::FrameKind::kPython;
        frame.framework = f.framework;
      }
      frames.push_back(std::move(frame));
    }
    return frames;
  }

  static std::optional<UserFrame> FirstUserFrame(const std::vector<Frame>& stack) {
    for (const Frame& f : stack) {
      if (!f.framework && (!f.file.empty() || !f.function.empty())) {
        return UserFrame{f.file, f.line, f.function};
      }
    }
    return std::nullopt;
  }

  OpRef MakeOpRef(ObjectId id) const {
    OpRef ref;
    ref.id = id;
    if (const OpInfo* op = FindOp(id)) {
      ref.name = Str(op->name);
      ref.overload = Str(op->overload);
      ref.thread = op->thread;
      ref.stack = StackFrames(op->stack);
      ref.user_frame = FirstUserFrame(ref.stack);
    }
    return ref;
  }

  // The op the user called, for an op seen in `innermost` (a write, or the op that created a
  // node): its outermost enclosing ATen op, which carries the stack.
  OpRef UserOpRef(ObjectId innermost) const {
    ObjectId outer = innermost;
    for (int depth = 0; depth < 256; ++depth) {
      const OpInfo* op = FindOp(outer);
      if (op == nullptr || op->parent == 0) break;
      const OpInfo* parent = FindOp(op->parent);
      if (parent == nullptr || parent->scope != OpScope::kFunction ||
          IsAutogradEngineName(Str(parent->name))) {
        break;
      }
      outer = op->parent;
    }
    OpRef ref = MakeOpRef(outer);
    if (outer != innermost) {
      if (const OpInfo* inner = FindOp(innermost)) {
        ref.detail = Str(inner->name);
        if (ref.stack.empty()) {
          ref.stack = StackFrames(inner->stack);
          ref.user_frame = FirstUserFrame(ref.stack);
        }
      }
    }
    return ref;
  }

  // The backward op an error came out of: the op itself or its nearest backward ancestor.
  ObjectId BackwardOpOf(ObjectId op) const {
    for (int depth = 0; op != 0 && depth < 256; ++depth) {
      const OpInfo* info = FindOp(op);
      if (info == nullptr) return 0;
      if (info->scope == OpScope::kBackwardFunction) return op;
      op = info->parent;
    }
    return 0;
  }

  static std::string CopyKindName(format::CudaCopyKind kind) {
    switch (kind) {
      case format::CudaCopyKind::kHostToDevice: return "[memcpy HtoD]";
      case format::CudaCopyKind::kDeviceToHost: return "[memcpy DtoH]";
      case format::CudaCopyKind::kDeviceToDevice: return "[memcpy DtoD]";
      case format::CudaCopyKind::kMemset: return "[memset]";
      case format::CudaCopyKind::kPeer: return "[memcpy PtoP]";
      default: return "[memcpy]";
    }
  }

  // PyTorch's message: "... is at version 3; expected version 1 instead ..."
  static bool MessageMatches(const std::string& message, uint32_t current, uint32_t saved) {
    std::string expect = "is at version " + std::to_string(current) + "; expected version " +
                         std::to_string(saved) + " instead";
    return message.find(expect) != std::string::npos;
  }

  Violation MakeViolation(const Finding& f) const {
    const NodeState& node = nodes_[f.node];
    const SavedState& s = saved_[f.saved];
    Violation v;
    v.kind = f.kind;
    bool first = true;
    for (ObjectId writer : f.writers) {
      if (first) {
        if (writer != 0) v.culprit = UserOpRef(writer);
        first = false;
      } else {
        v.later_culprits.push_back(writer != 0 ? UserOpRef(writer) : OpRef{});
      }
    }
    if (node.created_by != 0) v.victim = UserOpRef(node.created_by);
    v.backward_node = {node.id, Str(node.name), node.sequence_nr, node.forward_thread};
    v.saved_version = s.saved.saved_version;
    v.current_version = f.current_version;
    v.tensor.id = s.saved.tensor;
    v.tensor.saved_name = Str(s.saved.name);
    v.tensor.list_index = s.saved.list_index;
    if (s.meta_known) {
      v.tensor.shape = layouts_.Shape(s.layout);
      v.tensor.dtype = DTypeName(s.dtype);
      v.tensor.device = DeviceName(s.device);
    }
    v.tensor.storage = s.saved.storage;
    v.tensor.version_counter = s.saved.version_counter;
    v.tensor.is_output = s.saved.is_output;
    v.tensor.is_leaf = s.saved.is_leaf;
    v.tensor.output_nr = s.saved.output_nr;
    if (s.saved.is_output) {
      v.pytorch_names = "output " + std::to_string(s.saved.output_nr) + " of " + Str(node.name);
    } else if (f.view_regenerated) {
      v.pytorch_names = "output 0 of AsStridedBackward0";
    } else if (f.use_known && f.use_grad_fn != 0) {
      uint32_t grad_fn = index_.Find(f.use_grad_fn, IdKind::kNode);
      if (grad_fn != IdIndex::kAbsent) {
        v.pytorch_names = "output " + std::to_string(f.use_output_nr) + " of " +
                          Str(nodes_[grad_fn].name);
      }
    }
    if (f.kind == ViolationKind::kSilent) {
      v.evidence = f.by_fingerprint ? SilentEvidence::kFingerprint : SilentEvidence::kAliasedWrite;
    }
    if (f.has_hashes) {
      v.fingerprint = Fingerprints{f.hash_at_save, f.hash_at_use};
    }
    if (f.by_fingerprint) {
      // One candidate per op and call site: numpy() alone runs detach, to, resolve_conj...
      for (const auto& [op, wrote] : f.touches) {
        OpRef ref = UserOpRef(op);
        auto same = [&ref](const SilentCandidate& c) {
          return c.op.id == ref.id ||
                 (c.op.name == ref.name && c.op.user_frame && ref.user_frame &&
                  c.op.user_frame->file == ref.user_frame->file &&
                  c.op.user_frame->line == ref.user_frame->line);
        };
        auto it = std::find_if(v.candidates.begin(), v.candidates.end(), same);
        if (it != v.candidates.end()) {
          it->wrote |= wrote;
          continue;
        }
        v.candidates.push_back({std::move(ref), wrote});
      }
      // A candidate that wrote did write the saved bytes (through another tensor over them): the
      // first is the culprit, the others later ones.
      for (const SilentCandidate& c : v.candidates) {
        if (!c.wrote) continue;
        if (!v.culprit) {
          v.culprit = c.op;
        } else {
          v.later_culprits.push_back(c.op);
        }
      }
      for (const LooseKernel& k : loose_kernels_) {
        if (k.start_ns < f.save_ns || k.start_ns > f.use_ns) continue;
        KernelRef kernel;
        kernel.name = k.name != 0 ? Str(k.name) : CopyKindName(k.copy);
        kernel.device = k.device;
        kernel.start_ns = k.start_ns;
        kernel.end_ns = k.end_ns;
        v.kernels.push_back(std::move(kernel));
      }
    }
    v.simulated = f.simulated;
    v.backward_pass = f.pass;
    v.node_exec_op = f.exec_op;
    return v;
  }

  Report BuildReport() {
    Report report;
    report.records = seq_;
    report.ops = op_count_;
    report.tensors = tensors_.size();
    report.nodes = nodes_.size();
    report.node_executions = exec_count_;
    report.backward_passes = pass_count_;
    report.version_bumps = bump_count_;
    report.data_loss_records = data_loss_records_;

    std::unordered_map<ObjectId, std::string> exec_messages;
    for (const auto& [op, message] : op_errors_) {
      ObjectId backward = BackwardOpOf(op);
      if (backward != 0) exec_messages[backward] = message;
    }

    // PyTorch stopped at the first version violation of the first execution that threw (when the
    // message names versions, the one it names); without a recorded throw, at the first violation
    // the final message matches.
    std::optional<size_t> stopped;
    for (size_t i = 0; i < findings_.size() && !stopped; ++i) {
      const Finding& f = findings_[i];
      if (f.kind != ViolationKind::kVersion || f.simulated) continue;
      bool raised = f.exec_threw || exec_messages.count(f.exec_op) != 0;
      if (!raised) continue;
      const std::string* message = nullptr;
      if (auto it = exec_messages.find(f.exec_op); it != exec_messages.end()) {
        message = &it->second;
      } else if (!final_error_.empty()) {
        message = &final_error_;
      }
      stopped = i;
      if (message == nullptr) break;
      for (size_t j = i; j < findings_.size() && findings_[j].exec_op == f.exec_op; ++j) {
        const Finding& g = findings_[j];
        if (g.kind == ViolationKind::kVersion && !g.simulated &&
            MessageMatches(*message, g.current_version, saved_[g.saved].saved.saved_version)) {
          stopped = j;
          break;
        }
      }
    }
    if (!stopped && !final_error_.empty()) {
      for (size_t i = 0; i < findings_.size(); ++i) {
        const Finding& f = findings_[i];
        if (f.kind == ViolationKind::kVersion && !f.simulated &&
            MessageMatches(final_error_, f.current_version, saved_[f.saved].saved.saved_version)) {
          stopped = i;
          break;
        }
      }
    }

    std::vector<size_t> order;
    if (stopped) order.push_back(*stopped);
    for (size_t i = 0; i < findings_.size(); ++i) {
      if (!stopped || i != *stopped) order.push_back(i);
    }
    for (size_t i : order) {
      const Finding& f = findings_[i];
      Violation v = MakeViolation(f);
      bool this_stopped = stopped && i == *stopped;
      if (f.kind == ViolationKind::kVersion && !f.simulated) {
        auto it = exec_messages.find(f.exec_op);
        v.pytorch_raised = f.exec_threw || it != exec_messages.end() || this_stopped;
        if (it != exec_messages.end()) {
          v.pytorch_message = it->second;
        } else if (this_stopped && !final_error_.empty()) {
          v.pytorch_message = final_error_;
        }
      }
      report.violations.push_back(std::move(v));
    }

    if (!final_error_.empty() && findings_.empty()) {
      report.warnings.push_back(
          "PyTorch raised a version-counter error that the trace does not explain (was the "
          "recorder on for the whole step?)");
    }
    for (ObjectId op : threw_execs_) {
      auto it = exec_messages.find(op);
      if (it == exec_messages.end()) continue;
      bool explained = std::any_of(findings_.begin(), findings_.end(),
                                   [op](const Finding& f) { return f.exec_op == op; });
      if (!explained) {
        report.warnings.push_back("backward op " + std::to_string(op) +
                                  " raised a version-counter error that the trace does not "
                                  "explain");
      }
    }
    if (data_loss_records_ != 0) {
      report.warnings.push_back("the recorder lost " + std::to_string(data_lost_) +
                                " records (" + std::to_string(data_loss_records_) +
                                " data-loss records): culprits may be missing");
    }
    for (const auto& [name, count] : unknown_saved_nodes_) {
      report.warnings.push_back(std::to_string(count) + " node(s) " +
                                (Str(name).empty() ? std::string("of an unknown type")
                                                   : "of type " + Str(name)) +
                                ": saved tensors not visible to the recorder, not checked");
    }
    if (unknown_node_execs_ != 0) {
      report.warnings.push_back(std::to_string(unknown_node_execs_) +
                                " node execution(s) of nodes with no NodeRecord, not checked");
    }
    return report;
  }

  struct Candidate {
    ObjectId op;
    uint32_t thread;
  };

  bool finished_ = false;
  uint64_t seq_ = 0;

  std::vector<std::string> strings_;
  std::vector<format::FrameDef> frames_;
  std::vector<std::vector<InternId>> stacks_;

  IdIndex index_;
  LayoutPool layouts_;
  std::vector<OpInfo> ops_;
  std::vector<TensorState> tensors_;
  std::vector<CounterState> counters_;
  std::vector<NodeState> nodes_;
  std::vector<ObjectId> edges_;          // Nodes' edges, by NodeState::edges_begin.
  std::vector<SavedState> saved_;        // Nodes' saved tensors, by NodeState::saved_begin.
  std::vector<SilentWrite> silent_writes_;
  std::vector<StorageTouch> touches_;
  std::vector<LooseKernel> loose_kernels_;
  uint64_t fingerprinted_ = 0;           // Saved tensors with a fingerprint at save.
  // Fingerprinted saved tensors with known addresses, watched for writes through other storages
  // over the same memory; entries whose node ran are dropped lazily.
  std::vector<uint32_t> addressed_saved_;
  size_t addressed_live_hint_ = 0;
  std::vector<uint32_t> storage_heads_;  // By storage slot: first watched saved_ slot.
  // Per thread, the open ops that already have ended children, innermost last, with the first
  // record of their subtree so far. Ops nest properly on a thread, so a stack is enough.
  std::unordered_map<uint32_t, std::vector<std::pair<ObjectId, uint64_t>>> open_ops_;
  std::unordered_map<ObjectId, PendingExec> pending_execs_;       // By backward op id.
  std::vector<ObjectId> seen_counters_;  // Scratch for TrackVersions.
  std::vector<std::pair<ObjectId, uint64_t>>* open_ops_cache_ = nullptr;  // open_ops_[thread].
  uint32_t open_ops_thread_ = 0;

  // The open backward pass.
  bool pass_open_ = false;
  bool pass_threw_ = false;
  bool forward_seen_ = false;
  uint64_t pass_index_ = 0;
  uint64_t pass_count_ = 0;
  uint64_t pass_stop_seq_ = 0;
  uint32_t pass_root_ = IdIndex::kAbsent;
  std::vector<uint32_t> pass_executed_;
  std::vector<uint32_t> pass_threads_;
  std::vector<Candidate> candidates_;

  struct SequencedOp {
    uint64_t thread = 0;
    int64_t sequence_nr = -1;
    ObjectId op = 0;
  };
  static constexpr size_t kRecentSequencedOps = 4096;
  std::array<SequencedOp, kRecentSequencedOps> recent_sequenced_ops_{};
  uint64_t recent_next_ = 0;

  std::vector<Finding> findings_;
  std::vector<std::pair<ObjectId, std::string>> op_errors_;
  std::string final_error_;
  std::unordered_set<ObjectId> threw_execs_;
  std::unordered_map<InternId, uint64_t> unknown_saved_nodes_;

  uint64_t op_count_ = 0;
  uint64_t exec_count_ = 0;
  uint64_t bump_count_ = 0;
  uint64_t data_loss_records_ = 0;
  uint64_t data_lost_ = 0;
  uint64_t unknown_node_execs_ = 0;
};

Analyzer::Analyzer() : impl_(std::make_unique<Impl>()) {}
Analyzer::~Analyzer() = default;
void Analyzer::Add(const format::Record& record) { impl_->Add(record); }
Report Analyzer::Finish() { return impl_->Finish(); }

Report Analyze(const std::vector<format::Record>& records) {
  Analyzer analyzer;
  for (const auto& record : records) analyzer.Add(record);
  return analyzer.Finish();
}

}  // namespace torchrr::replayer
