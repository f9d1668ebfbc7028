// The analysis behind `torchrr replay`; the contract is in torchrr/replayer/replayer.h.
//
// Analyzer::Impl reads the records in file order into an AnalysisState (analysis_state.h) and
// hands each to the part that needs it:
//   - here: definitions, tensors, ops and their nesting, every version counter's writes, nodes and
//     their saved tensors, PyTorch's errors, data loss, CUDA work outside ops;
//   - SilentWriteWatch (silent_writes.h): writes into saved bytes that no counter saw;
//   - BackwardReplay (backward_replay.h): node executions, grouped into backward passes and
//     checked as autograd checks them;
// and at the end BuildReport (report_builder.h) turns the findings into a Report.
//
// A node's version check happens at the start of its execution: the seq of the first record of
// the execution's op subtree (ops are written at their end, so the children of the backward op
// come before it).
#include <algorithm>
#include <array>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "analysis_state.h"
#include "backward_replay.h"
#include "content_lineage.h"
#include "gradient_cut.h"
#include "non_finite.h"
#include "report_builder.h"
#include "silent_writes.h"
#include "torchrr/format/step_rule.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

using format::InternId;
using format::ObjectId;
using format::OpScope;

constexpr std::string_view kVersionErrorPhrase = "modified by an inplace operation";

// Stores `value` at `id` in a table of interned definitions.
template <typename T>
void Put(std::vector<T>& table, uint32_t id, T value) {
  // 16 Mi entries: far more than any trace interns; a corrupt id past that is dropped.
  if (id == 0 || id >= (1u << 24)) return;
  if (id >= table.size()) table.resize(id + 1);
  table[id] = std::move(value);
}

// The source lines an analysis keeps at most: far more than the context of every frame of a
// real trace.
constexpr size_t kMaxRecordedSourceBytes = 64u << 20;

}  // namespace

class Analyzer::Impl {
 public:
  void Add(const format::Record& record);
  void SetRecordingTorch(std::string_view version) { state_.recording_torch = version; }
  Report Finish();

 private:
  // An op with a sequence number, remembered to find the creator of a node seen only later.
  struct SequencedOp {
    uint64_t thread = 0;
    int64_t sequence_nr = -1;
    ObjectId op = 0;
  };
  // An open op on a thread: its id and the first record of its subtree so far.
  using OpenOp = std::pair<ObjectId, uint64_t>;

  void On(const format::StringDef& r);
  void On(const format::FrameDef& r) { Put(state_.frames, r.id, r); }
  void On(const format::StackDef& r) { Put(state_.stacks, r.id, r.frames); }
  void On(const format::TensorInfo& r);
  void On(const format::OpRecord& r);
  void On(const format::NodeRecord& r);
  void On(const format::NodeExecRecord& r) {
    non_finite_.OnNodeExec(r);
    backward_.OnNodeExec(r);
  }
  void On(const format::ErrorRecord& r);
  void On(const format::DataLossRecord& r);
  void On(const format::CudaKernelRecord& r);
  void On(const format::CudaMemcpyRecord& r);
  void On(const format::FingerprintRecord& r) { silent_.OnFingerprint(r); }
  void On(const format::SourceFile& r);
  void On(const format::SourceLines& r);
  void On(const format::StepRecord& r) {
    if (state_.steps++ == 0) state_.first_step = r.step;
    state_.last_step = r.step;
    state_.current_step = r.step;
  }
  void NoteStepBoundary(const format::OpRecord& r);
  void NoteStashReads(const format::OpRecord& r);

  CounterState& GetCounter(ObjectId id);
  uint64_t CloseOpSubtree(const format::OpRecord& r);
  std::vector<OpenOp>& OpenOps(uint32_t thread);
  void TrackVersions(const format::OpRecord& r);
  void RecordBump(CounterState& counter, const format::OpRecord& r, uint32_t before,
                  uint32_t after, const TensorState& tensor, ObjectId tensor_id,
                  ObjectId counter_id);
  ObjectId CreatorBySequence(const format::NodeRecord& r) const;
  SavedState MakeSavedState(const format::SavedTensor& saved, const format::NodeRecord& node) const;
  const TensorState* RecentOutputOf(ObjectId node, uint32_t output_nr) const;
  void AddLooseKernel(const LooseKernel& kernel);
  void NoteDetach(const format::OpRecord& r);
  void NoteCachedOutput(const format::OpRecord& r);
  void NoteThrew(const format::OpRecord& r);

  AnalysisState state_;
  ContentLineage lineage_{state_};
  SilentWriteWatch silent_{state_};
  BackwardReplay backward_{state_, silent_};
  GradientCutWatch cut_{state_};
  NonFiniteWatch non_finite_{state_};
  bool finished_ = false;

  // Per thread, the open ops that already have ended children, innermost last. Ops nest properly
  // on a thread, so a stack is enough.
  std::unordered_map<uint32_t, std::vector<OpenOp>> open_ops_;
  std::vector<OpenOp>* open_ops_cache_ = nullptr;  // open_ops_[open_ops_thread_].
  uint32_t open_ops_thread_ = 0;
  std::vector<ObjectId> seen_counters_;  // Scratch for TrackVersions.
  // The interned names of detach_: the ATen op, and the range PyTorch opens inside it.
  InternId detach_op_name_ = 0;
  // set_data (`.data =`) is no op of the dispatcher's; the check it makes first is: the swap of
  // its first argument's storage it announces, by tensor, until the tensor shows another storage.
  InternId shallow_copy_check_name_ = 0;
  std::unordered_map<ObjectId, ObjectId> swap_announced_;
  InternId detach_inner_name_ = 0;
  InternId detach_name_ = 0;  // aten::detach: what selective checkpointing caches is detached.

  // Steps found by the recorder's rule (first sight of each node counts).
  format::StepRule step_rule_;

  // The latest top-level op, and whether it threw: where an error the program raised next came
  // from.
  ObjectId last_top_level_op_ = 0;
  bool last_top_level_threw_ = false;

  // The tensors of the latest TensorInfo records: a node's outputs come just before the node.
  static constexpr size_t kRecentTensors = 16;
  std::array<ObjectId, kRecentTensors> recent_tensors_{};
  uint64_t recent_tensors_next_ = 0;

  static constexpr size_t kRecentSequencedOps = 4096;
  // Bounds the cached outputs and ops that threw kept (the latest are the ones needed).
  static constexpr size_t kMaxNoted = 1 << 16;
  std::array<SequencedOp, kRecentSequencedOps> recent_sequenced_ops_{};
  uint64_t recent_next_ = 0;

  // What the ops directly inside a Python Function's forward read (ops the recorder gave stacks,
  // run with grad mode off), by the apply's op id, until the apply's record: by counter, the
  // first tensor read and its version then, and the counters an op there wrote or made.
  struct ForwardReads {
    std::vector<std::pair<ObjectId, format::TensorUse>> first;  // (counter, use)
    std::vector<ObjectId> written;
  };
  std::unordered_map<ObjectId, ForwardReads> forward_reads_;
  void NoteForwardReads(const format::OpRecord& r);
  void AddRecomputeReads(const format::NodeRecord& r, NodeState& node);

  // The latest autograd Function applies (a Python Function's op, named by its class:
  // "CompiledFunction"), with their inputs' versions at their end. What a Function's node keeps
  // unchecked (AOTAutograd's _tensors_no_vc_check) is recorded when the node is first seen, maybe
  // after a write to it: an input's version at the apply's end is the one backward was meant to
  // see.
  struct FunctionApply {
    ObjectId op = 0;
    std::vector<format::TensorUse> inputs;
  };
  static constexpr size_t kRecentFunctionApplies = 64;
  std::array<FunctionApply, kRecentFunctionApplies> recent_applies_{};
  uint64_t recent_applies_next_ = 0;
  void NoteFunctionApply(const format::OpRecord& r);
  void UseVersionsAtApply(ObjectId created_by, uint32_t saved_begin);
};

void Analyzer::Impl::Add(const format::Record& record) {
  if (finished_) return;
  ++state_.seq;
  std::visit([this](const auto& r) { On(r); }, record);
}

Report Analyzer::Impl::Finish() {
  if (finished_) return {};
  backward_.Finish();
  cut_.Finish();
  non_finite_.Finish();
  finished_ = true;
  Report report = BuildReport(state_);
  report.sources = std::move(state_.sources);
  return report;
}

void Analyzer::Impl::On(const format::SourceFile& r) {
  const std::string& path = state_.Str(r.file);
  if (path.empty()) return;
  RecordedSource& source = state_.sources[path];
  source.hash = r.hash;
  source.bytes = r.bytes;
  source.lines = r.lines;
}

void Analyzer::Impl::On(const format::SourceLines& r) {
  const std::string& path = state_.Str(r.file);
  if (path.empty() || r.first_line == 0) return;
  RecordedSource& source = state_.sources[path];
  uint32_t number = r.first_line;
  for (const std::string& line : r.text) {
    // A stranger's trace may carry any amount: what a report quotes is kept, up to a bound.
    if (state_.source_bytes + line.size() > kMaxRecordedSourceBytes || number == 0) break;
    auto [it, inserted] = source.text.try_emplace(number++, line);
    if (inserted) state_.source_bytes += line.size();
  }
}

void Analyzer::Impl::On(const format::StringDef& r) {
  if (r.text == "aten::detach_") detach_op_name_ = r.id;
  if (r.text == "detach_") detach_inner_name_ = r.id;
  if (r.text == "aten::detach") detach_name_ = r.id;
  if (r.text == "aten::_has_compatible_shallow_copy_type") shallow_copy_check_name_ = r.id;
  cut_.OnString(r);
  Put(state_.strings, r.id, Shortened(r.text));
}

// --- Tensors -----------------------------------------------------------------------------------

void Analyzer::Impl::On(const format::TensorInfo& r) {
  uint32_t slot = state_.index.Find(r.tensor, IdKind::kTensor);
  if (slot == IdIndex::kAbsent) {
    slot = static_cast<uint32_t>(state_.tensors.size());
    state_.tensors.emplace_back();
    state_.index.Set(r.tensor, IdKind::kTensor, slot);
  }
  recent_tensors_[recent_tensors_next_++ % kRecentTensors] = r.tensor;
  TensorState& t = state_.tensors[slot];
  // The same tensor on another storage, after an op announced a swap of it: `.data =`.
  if (t.storage != 0 && r.storage != t.storage) {
    if (auto announced = swap_announced_.find(r.tensor); announced != swap_announced_.end()) {
      state_.swaps[r.tensor].push_back(
          {state_.seq, announced->second, r.storage, lineage_.Of(r.storage)});
      swap_announced_.erase(announced);
    }
  }
  t.storage = r.storage;
  t.storage_nbytes = r.storage_nbytes;
  t.storage_address = r.storage_address;
  t.counter = r.version_counter;
  t.grad_fn = r.grad_fn;
  t.storage_offset = r.storage_offset;
  t.layout = state_.layouts.Intern(r.shape, r.strides);
  t.output_nr = r.output_nr;
  t.dtype = r.dtype;
  t.device = r.device;
  t.is_leaf = r.is_leaf;
  t.requires_grad = r.requires_grad;
  t.inner = r.inner;
  if (r.inner != 0) state_.wrappers_tied = true;
}

CounterState& Analyzer::Impl::GetCounter(ObjectId id) {
  uint32_t slot = state_.index.Find(id, IdKind::kCounter);
  if (slot == IdIndex::kAbsent) {
    slot = static_cast<uint32_t>(state_.counters.size());
    state_.counters.emplace_back().first_seq = state_.seq;
    state_.index.Set(id, IdKind::kCounter, slot);
  }
  return state_.counters[slot];
}

// --- Ops ---------------------------------------------------------------------------------------

void Analyzer::Impl::On(const format::OpRecord& r) {
  ++state_.op_count;
  uint32_t slot = static_cast<uint32_t>(state_.ops.size());
  state_.ops.push_back(
      {r.parent, r.name, r.overload, r.stack, r.thread, r.scope, r.grad_mode, r.module_path});
  state_.index.Set(r.op, IdKind::kOp, slot);
  if (r.scope == OpScope::kFunction && r.sequence_nr >= 0) {
    recent_sequenced_ops_[recent_next_++ % kRecentSequencedOps] = {r.thread, r.sequence_nr, r.op};
    if (!r.inputs.empty()) NoteFunctionApply(r);
  }
  if (r.parent != 0 && r.stack != 0 && !r.grad_mode && r.scope == OpScope::kFunction) {
    NoteForwardReads(r);
  }
  if (!forward_reads_.empty()) forward_reads_.erase(r.op);  // An apply's: its node has them.
  if (r.parent == 0) {
    last_top_level_op_ = r.op;
    last_top_level_threw_ = r.threw;
  }
  NoteStepBoundary(r);
  uint64_t subtree_first = CloseOpSubtree(r);
  if (!state_.stash_storages.empty()) NoteStashReads(r);
  lineage_.OnOp(r);
  TrackVersions(r);
  if (r.name != 0 && (r.name == detach_op_name_ || r.name == detach_inner_name_)) NoteDetach(r);
  if (r.name != 0 && r.name == detach_name_ && r.parent != 0) NoteCachedOutput(r);
  if (r.name != 0 && r.name == shallow_copy_check_name_ && !r.inputs.empty()) {
    swap_announced_[r.inputs[0].tensor] = r.op;
  }
  if (r.threw && r.scope == OpScope::kFunction) NoteThrew(r);
  silent_.OnOp(r);
  cut_.OnOp(r);
  non_finite_.OnOp(r, state_.inferred_step, state_.current_step);
  if (r.scope == OpScope::kBackwardFunction) {
    backward_.OnBackwardOp(r, subtree_first);
  } else {
    backward_.OnForwardOp(r);
  }
}

void Analyzer::Impl::NoteForwardReads(const format::OpRecord& r) {
  ForwardReads& reads = forward_reads_[r.parent];
  for (const format::TensorUse& use : r.inputs) {
    const TensorState* t = state_.FindTensor(use.tensor);
    if (t == nullptr || t->counter == 0) continue;
    if (use.version_after != use.version_before) {
      reads.written.push_back(t->counter);
      continue;
    }
    auto seen = std::find_if(reads.first.begin(), reads.first.end(),
                             [&](const auto& read) { return read.first == t->counter; });
    if (seen == reads.first.end()) reads.first.emplace_back(t->counter, use);
  }
  // What the block made is not read from outside it; a view of an input (its counter) is that
  // input read.
  for (const format::TensorUse& out : r.outputs) {
    const TensorState* t = state_.FindTensor(out.tensor);
    if (t == nullptr || t->counter == 0) continue;
    const bool view = std::any_of(r.inputs.begin(), r.inputs.end(), [&](const auto& use) {
      const TensorState* input = state_.FindTensor(use.tensor);
      return input != nullptr && input->counter == t->counter;
    });
    if (!view) reads.written.push_back(t->counter);
  }
}

// Reentrant checkpointing (torch.utils.checkpoint, use_reentrant=True) runs the block under
// no_grad in forward and again in backward, reading the weights and buffers as they are then;
// PyTorch checks only the block's inputs, which CheckpointFunction saves. Each other tensor the
// block read in forward, and did not write itself, becomes an unchecked saved tensor of the
// checkpoint's node: a write to it before the recomputation is a wrong gradient.
void Analyzer::Impl::AddRecomputeReads(const format::NodeRecord& r, NodeState& node) {
  auto it = forward_reads_.find(node.created_by);
  if (it == forward_reads_.end()) return;
  const ForwardReads& reads = it->second;
  const uint32_t saved_end = static_cast<uint32_t>(state_.saved.size());
  for (const auto& [counter, use] : reads.first) {
    if (std::find(reads.written.begin(), reads.written.end(), counter) != reads.written.end()) {
      continue;
    }
    bool saved = false;  // One of the block's inputs: PyTorch checks it.
    for (uint32_t k = node.saved_begin; k < saved_end && !saved; ++k) {
      saved = state_.saved[k].saved.version_counter == counter;
    }
    const TensorState* t = state_.FindTensor(use.tensor);
    if (saved || t == nullptr || !t->is_leaf) continue;  // Weights and buffers, not activations.
    format::SavedTensor read;
    read.tensor = use.tensor;
    read.storage = t->storage;
    read.version_counter = counter;
    read.saved_version = use.version_before;
    read.defined = true;
    read.checked = false;
    read.is_leaf = true;
    read.list_index = format::TensorUse::kNotInList;
    state_.saved.push_back(MakeSavedState(read, r));
    SavedState& s = state_.saved.back();
    s.save_seq = state_.seq;
    s.content_at_save = lineage_.Of(read.storage);
    s.read_by_recompute = true;
  }
}

// The stashes (ctx attributes' tensors) that `r` took as inputs, or that ops in its subtree did,
// handed up to its parent; a backward op keeps them for its execution's check.
void Analyzer::Impl::NoteStashReads(const format::OpRecord& r) {
  std::vector<ObjectId> reads;
  if (auto own = state_.stash_reads.find(r.op); own != state_.stash_reads.end()) {
    reads = std::move(own->second);
    state_.stash_reads.erase(own);
  }
  for (const format::TensorUse& use : r.inputs) {
    const TensorState* t = state_.FindTensor(use.tensor);
    if (t != nullptr && state_.stash_storages.contains(t->storage)) reads.push_back(t->storage);
  }
  if (reads.empty()) return;
  if (r.scope == OpScope::kBackwardFunction) {
    state_.stash_reads[r.op] = std::move(reads);
  } else if (r.parent != 0) {
    std::vector<ObjectId>& up = state_.stash_reads[r.parent];
    up.insert(up.end(), reads.begin(), reads.end());
  }
}

// The recorder's step rule (format::StepRule), for traces without StepRecords. Backward passes
// open after their step's forward, so the count at a pass's first execution is its step.
void Analyzer::Impl::NoteStepBoundary(const format::OpRecord& r) {
  const bool engine_wrapper = r.parent == 0 && IsAutogradEngineName(state_.Str(r.name));
  if (step_rule_.OnOp(r, engine_wrapper)) ++state_.inferred_step;
}

// The op ended: returns the first record of its subtree, and hands that up to its parent, which
// is still open.
uint64_t Analyzer::Impl::CloseOpSubtree(const format::OpRecord& r) {
  uint64_t subtree_first = state_.seq;
  if (r.parent == 0 && open_ops_.empty()) return subtree_first;
  std::vector<OpenOp>& open = OpenOps(r.thread);
  // Entries of ops that never ended (a truncated subtree) are dropped on the way.
  while (!open.empty() && open.back().first != r.op && open.back().first != r.parent &&
         state_.FindOp(open.back().first) != nullptr) {
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
  return subtree_first;
}

std::vector<Analyzer::Impl::OpenOp>& Analyzer::Impl::OpenOps(uint32_t thread) {
  if (open_ops_cache_ == nullptr || open_ops_thread_ != thread) {
    open_ops_cache_ = &open_ops_[thread];
    open_ops_thread_ = thread;
  }
  return *open_ops_cache_;
}

// Versions: every tensor use tells the counter's value at the op's start and end.
void Analyzer::Impl::TrackVersions(const format::OpRecord& r) {
  seen_counters_.clear();
  auto visit = [&](const format::TensorUse& use) {
    const TensorState* tensor = state_.FindTensor(use.tensor);
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
    } else if (use.version_before < counter.last_version && counter.last_op != 0 &&
               r.start_ns > counter.last_end_ns && !state_.IsDescendant(counter.last_op, r.op)) {
      // Versions only grow, so an op that started after another ended (not one around it,
      // which started first) cannot see a lower one unless something set the counter back.
      counter.bumps.push_back({r.op, state_.seq, counter.last_version, use.version_before,
                               use.tensor});
      state_.reset_previous_ops[state_.seq] = counter.last_op;
      counter.reset_seen = true;
      counter.last_version = use.version_before;
      counter.last_op = 0;
    } else if (use.version_before > counter.last_version) {
      // Moved between two recorded uses, by nothing recorded (or by an op still running on
      // another thread: RecordBump replaces this entry when that op ends).
      counter.bumps.push_back({0, state_.seq, counter.last_version, use.version_before, 0});
    }
    if (use.version_after > use.version_before) {
      RecordBump(counter, r, use.version_before, use.version_after, *tensor, use.tensor,
                 counter_id);
    }
    if (use.version_after > counter.last_version || counter.last_op == 0) {
      counter.last_version = std::max(counter.last_version, use.version_after);
      counter.last_op = r.op;
      counter.last_end_ns = r.end_ns;
    } else if (use.version_after == counter.last_version && r.end_ns < counter.last_end_ns) {
      counter.last_op = r.op;
      counter.last_end_ns = r.end_ns;
    }
  };
  for (const auto& use : r.inputs) visit(use);
  for (const auto& use : r.outputs) visit(use);
}

void Analyzer::Impl::RecordBump(CounterState& counter, const format::OpRecord& r, uint32_t before,
                                uint32_t after, const TensorState& tensor, ObjectId tensor_id,
                                ObjectId counter_id) {
  auto& bumps = counter.bumps;
  bool nested_write = !bumps.empty() && bumps.back().op != 0 && !bumps.back().IsReset() &&
                            state_.IsDescendant(bumps.back().op, r.op);
  const uint64_t content = lineage_.Of(tensor.storage);
  // A nested op showed this write already: the innermost op keeps it, the outermost op's lineage
  // stands (what a later write of the same kind is compared with).
  if (nested_write && bumps.back().after >= after) {
    // Its range may also hold a move no recorded op made, seen as a gap while it ran: the op's
    // own (a torch.library custom op bumps the counter of what it mutates, around its body's
    // writes). Then the op made the whole range, as PyTorch's versions say, and no part of it
    // passes for an unrecorded write.
    size_t first = bumps.size();
    bool gap = false;
    while (first > 0 && bumps[first - 1].before >= before && !bumps[first - 1].IsReset() &&
           (bumps[first - 1].op == 0 || state_.IsDescendant(bumps[first - 1].op, r.op))) {
      gap = gap || bumps[first - 1].op == 0;
      --first;
    }
    if (!gap) {
      bumps.back().content = content;
      return;
    }
    bumps.resize(first);
    nested_write = false;
  }
  if (nested_write && bumps.back().after > before) before = bumps.back().after;
  // Writes seen as gaps before this op ended were this op's.
  while (!bumps.empty() && bumps.back().op == 0 && bumps.back().before >= before &&
         bumps.back().after <= after) {
    bumps.pop_back();
  }
  bumps.push_back({r.op, state_.seq, before, after, tensor_id, content});
  ++state_.bump_count;
  if (tensor.is_leaf && tensor.requires_grad) {
    state_.parameter_writes.push_back({state_.seq, r.op, tensor.inner != 0});
  }
  silent_.OnWrite(r.op, tensor, counter_id);
}

// --- Nodes and their saved tensors -------------------------------------------------------------

// A node the recorder found only later, through another node's edges (a Python
// torch.autograd.Function's node is attached after its forward ran): the recent forward op that
// carried the node's sequence number on its thread created it.
ObjectId Analyzer::Impl::CreatorBySequence(const format::NodeRecord& r) const {
  if (r.sequence_nr < 0) return 0;
  size_t n = std::min<uint64_t>(recent_next_, kRecentSequencedOps);
  for (size_t i = 1; i <= n; ++i) {
    const SequencedOp& op = recent_sequenced_ops_[(recent_next_ - i) % kRecentSequencedOps];
    if (op.sequence_nr == r.sequence_nr && op.thread == r.forward_thread) return op.op;
  }
  return 0;
}

void Analyzer::Impl::On(const format::NodeRecord& r) {
  if (state_.index.Find(r.node, IdKind::kNode) != IdIndex::kAbsent) return;  // First sight wins.
  step_rule_.OnNode();
  NodeState node;
  node.id = r.node;
  node.name = r.name;
  node.sequence_nr = r.sequence_nr;
  node.forward_thread = r.forward_thread;
  node.created_by = r.created_by != 0 ? r.created_by : CreatorBySequence(r);
  node.variable = r.variable;
  node.saved_kind = r.saved_kind;
  node.edges_begin = static_cast<uint32_t>(state_.edges.size());
  for (const auto& edge : r.edges) {
    if (edge.node != 0) state_.edges.push_back(edge.node);
  }
  node.edges_count = static_cast<uint32_t>(state_.edges.size()) - node.edges_begin;
  node.saved_begin = static_cast<uint32_t>(state_.saved.size());
  for (const auto& saved : r.saved) {
    state_.saved.push_back(MakeSavedState(saved, r));
    SavedState& s = state_.saved.back();
    s.save_seq = state_.seq;
    s.content_at_save = lineage_.Of(saved.storage);
    s.stash = !saved.checked && state_.Str(saved.name).starts_with("ctx.");
    if (s.stash && s.bytes_storage != 0) state_.stash_storages.insert(s.bytes_storage);
  }
  if (state_.Str(r.name) == "CheckpointFunctionBackward") AddRecomputeReads(r, node);
  node.saved_count = static_cast<uint32_t>(state_.saved.size()) - node.saved_begin;
  if (r.saved_kind == format::SavedSetKind::kCustom && node.created_by != 0) {
    UseVersionsAtApply(node.created_by, node.saved_begin);
  }
  if (r.saved_kind == format::SavedSetKind::kUnknown) ++state_.unknown_saved_nodes[r.name];
  uint32_t slot = static_cast<uint32_t>(state_.nodes.size());
  state_.nodes.push_back(node);
  state_.index.Set(r.node, IdKind::kNode, slot);
  silent_.Watch(slot);
  backward_.OnNode(slot);
}

void Analyzer::Impl::NoteFunctionApply(const format::OpRecord& r) {
  // ATen ops are named "aten::..."; a Function's op by its class alone.
  if (state_.Str(r.name).find("::") != std::string::npos) return;
  FunctionApply& apply = recent_applies_[recent_applies_next_++ % kRecentFunctionApplies];
  apply.op = r.op;
  apply.inputs = r.inputs;
}

void Analyzer::Impl::UseVersionsAtApply(ObjectId created_by, uint32_t saved_begin) {
  const size_t n = std::min<uint64_t>(recent_applies_next_, kRecentFunctionApplies);
  const FunctionApply* apply = nullptr;
  for (size_t i = 1; i <= n && apply == nullptr; ++i) {
    const FunctionApply& a = recent_applies_[(recent_applies_next_ - i) % kRecentFunctionApplies];
    if (a.op == created_by) apply = &a;
  }
  if (apply == nullptr) return;
  for (size_t k = saved_begin; k < state_.saved.size(); ++k) {
    format::SavedTensor& saved = state_.saved[k].saved;
    if (!IsUncheckedButKnown(saved) || saved.has_hooks) continue;
    for (const format::TensorUse& use : apply->inputs) {
      const TensorState* input = state_.FindTensor(use.tensor);
      if (use.tensor == saved.tensor ||
          (input != nullptr && input->counter == saved.version_counter)) {
        saved.saved_version = use.version_after;
        break;
      }
    }
  }
}

// The output `output_nr` of `node` among the tensors described just before, or nullptr.
const TensorState* Analyzer::Impl::RecentOutputOf(ObjectId node, uint32_t output_nr) const {
  size_t n = std::min<uint64_t>(recent_tensors_next_, kRecentTensors);
  for (size_t i = 1; i <= n; ++i) {
    const TensorState* t =
        state_.FindTensor(recent_tensors_[(recent_tensors_next_ - i) % kRecentTensors]);
    if (t != nullptr && t->grad_fn == node && t->output_nr == output_nr) return t;
  }
  return nullptr;
}

// The saved tensor, with its tensor's metadata at the save (the latest TensorInfo before the
// node's record).
SavedState Analyzer::Impl::MakeSavedState(const format::SavedTensor& saved,
                                          const format::NodeRecord& node) const {
  SavedState s;
  s.saved = saved;
  s.bytes_storage = saved.storage;
  s.saved_by = node.created_by;
  const TensorState* t = state_.FindTensor(saved.tensor);
  if (t == nullptr && saved.tensor == 0 && saved.is_output && saved.has_hooks) {
    // Packed by a hook, the saved tensor is not known; what was packed is the node's output,
    // described just before the node. Its metadata says what the unpack hook should give back;
    // its bytes and counter are not the saved ones (a hook keeps what it likes).
    if (const TensorState* output = RecentOutputOf(node.node, saved.output_nr)) {
      s.meta_known = true;
      s.layout = output->layout;
      s.dtype = output->dtype;
      s.device = output->device;
    }
    return s;
  }
  if (t == nullptr) return s;
  s.meta_known = true;
  s.grad_fn = t->grad_fn;
  s.layout = t->layout;
  s.dtype = t->dtype;
  s.device = t->device;
  // A wrapper's own storage holds no bytes: its data are those of the tensor it wraps, which a
  // write through that tensor changes behind the wrapper's counter.
  const TensorState* bytes = t;
  if (t->inner != 0) {
    if (const TensorState* inner = state_.FindTensor(t->inner); inner && inner->storage != 0) {
      bytes = inner;
    }
  }
  s.bytes_storage = bytes->storage;
  std::tie(s.byte_first, s.byte_last) =
      state_.layouts.ByteRange(bytes->layout, bytes->storage_offset, DTypeSize(bytes->dtype));
  if (bytes->storage_address != 0 && s.byte_last != UINT64_MAX) {
    s.address_first = bytes->storage_address + s.byte_first;
    s.address_last = bytes->storage_address + s.byte_last;
  }
  return s;
}

// --- Errors and the rest -----------------------------------------------------------------------

void Analyzer::Impl::On(const format::ErrorRecord& r) {
  if (r.kind == format::ErrorKind::kRecorder) {
    if (!state_.recording_stopped) {
      state_.recording_stopped = RecordingStop{r.op, r.thread, r.time_ns, r.message};
    }
    return;
  }
  cut_.OnError(r);
  if (r.message.find(kVersionErrorPhrase) == std::string::npos) {
    if (r.kind == format::ErrorKind::kCppException && r.op != 0) {
      state_.other_op_errors.emplace_back(r.op, r.message);
    } else {
      state_.other_final_error = r.message;
      state_.program_error = AnalysisState::ProgramErrorSeen{
          state_.Str(r.type), r.message, last_top_level_threw_ ? last_top_level_op_ : 0};
    }
    return;
  }
  if (r.kind == format::ErrorKind::kCppException && r.op != 0) {
    state_.op_errors.emplace_back(r.op, r.message);
  } else {
    state_.final_error = r.message;
    state_.program_error.reset();
  }
}

void Analyzer::Impl::On(const format::DataLossRecord& r) {
  ++state_.data_loss_records;
  state_.data_lost += r.records;
}

// Kernels inside ops are the ops' work; those outside any op are candidates for silent writes.
void Analyzer::Impl::On(const format::CudaKernelRecord& r) {
  if (r.op == 0) {
    AddLooseKernel({r.name, format::CudaCopyKind::kUnknown, r.device, r.start_ns, r.end_ns});
  }
}

void Analyzer::Impl::On(const format::CudaMemcpyRecord& r) {
  if (r.op == 0) AddLooseKernel({0, r.kind, r.device, r.start_ns, r.end_ns});
}

// detach_() on a tensor a node saved as an input cuts it from its graph: autograd's unpack
// raises for it (BackwardReplay::CheckDetached).
void Analyzer::Impl::NoteDetach(const format::OpRecord& r) {
  if (r.inputs.empty()) return;
  state_.detaches[r.inputs.front().tensor].emplace_back(state_.seq, r.op);
}

// Selective activation checkpointing's caching mode keeps a detached alias of the outputs of the
// ops its policy saves: an aten::detach nested in the op, on its output.
void Analyzer::Impl::NoteCachedOutput(const format::OpRecord& r) {
  if (r.inputs.empty()) return;
  auto& cached = state_.cached_outputs;
  if (cached.size() >= kMaxNoted) cached.erase(cached.begin(), cached.begin() + kMaxNoted / 2);
  cached.push_back({r.parent, r.inputs.front().tensor, r.inputs.front().version_before,
                    state_.seq});
}

void Analyzer::Impl::NoteThrew(const format::OpRecord& r) {
  auto& threw = state_.threw_ops;
  if (threw.size() >= kMaxNoted) threw.erase(threw.begin(), threw.begin() + kMaxNoted / 2);
  threw.emplace_back(r.op, state_.seq);
}

void Analyzer::Impl::AddLooseKernel(const LooseKernel& kernel) {
  // 1 Mi: a bound on memory for a trace full of raw launches; later ones are not candidates.
  if (state_.loose_kernels.size() < (1u << 20)) state_.loose_kernels.push_back(kernel);
}

Analyzer::Analyzer() : impl_(std::make_unique<Impl>()) {}
Analyzer::~Analyzer() = default;
void Analyzer::Add(const format::Record& record) { impl_->Add(record); }
Report Analyzer::Finish() { return impl_->Finish(); }

void Analyzer::SetRecordingTorch(std::string_view torch_version) {
  impl_->SetRecordingTorch(torch_version);
}

Report Analyze(const std::vector<format::Record>& records) {
  Analyzer analyzer;
  for (const auto& record : records) analyzer.Add(record);
  return analyzer.Finish();
}

}  // namespace torchrr::replayer
