// AnalysisState: what the analysis keeps of a trace, and what it found.
//
// The analysis reads the records once, in file order, and keeps only what a later record can need:
//   - strings, frames, stacks (interned, small);
//   - per op: name, stack, parent, scope (to name culprits and victims and to walk nesting);
//   - per tensor: its latest metadata (shapes interned in a LayoutPool);
//   - per version counter: every in-place write (a Bump), in record order;
//   - per node: its edges and saved tensors (flat pools, no per-node allocation).
// analyzer.cc, silent_writes.cc and backward_replay.cc fill it; report_builder.cc reads it into a
// Report. Plain data, owned by Analyzer::Impl and used only on the thread that feeds it.
//
// Time is record order ("seq", one tick per record).
#ifndef TORCHRR_REPLAYER_SRC_ANALYSIS_STATE_H_
#define TORCHRR_REPLAYER_SRC_ANALYSIS_STATE_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "id_index.h"
#include "layout_pool.h"
#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// Ops the autograd engine wraps node executions in ("autograd::engine::evaluate_function: X"):
// neither forward ops nor the user's in-place calls.
inline bool IsAutogradEngineName(std::string_view name) { return name.starts_with("autograd::"); }

// autograd's SavedVariable::unpack checks the version of a defined saved tensor without saved
// tensor hooks (hooks hand back whatever they packed, so there is no counter to compare), and
// torch.compile's AOTAutograd saves some tensors with no check at all.
inline bool IsVersionChecked(const format::SavedTensor& s) {
  return s.defined && !s.has_hooks && s.checked;
}
// A saved tensor that backward uses unchecked, and whose tensor the trace names (what a hook
// packed, or what AOTAutograd saved): a write to it in between is a silently wrong gradient.
inline bool IsUncheckedButKnown(const format::SavedTensor& s) {
  return s.defined && !IsVersionChecked(s) && s.version_counter != 0 &&
         (!s.has_hooks || s.hook == format::SavedHook::kPackedTensor);
}

struct OpInfo {
  format::ObjectId parent = 0;
  format::InternId name = 0;
  format::InternId overload = 0;
  format::InternId stack = 0;
  uint32_t thread = 0;
  format::OpScope scope = format::OpScope::kFunction;
  bool grad_mode = true;
  format::InternId module = 0;  // OpRecord.module_path (1.8).
};

struct TensorState {
  format::ObjectId storage = 0;
  uint64_t storage_nbytes = 0;   // As last recorded: 0 for a storage resized to nothing.
  uint64_t storage_address = 0;  // Format 1.1, --verify-saved traces only.
  format::ObjectId counter = 0;
  format::ObjectId grad_fn = 0;
  int64_t storage_offset = 0;
  uint32_t layout = LayoutPool::kNone;
  uint32_t output_nr = 0;
  format::DType dtype = 0;
  format::Device device;
  bool is_leaf = true;
  bool requires_grad = false;
  // A wrapper subclass's wrapped tensor (TensorInfo.inner, format 1.9): a DTensor's shard.
  format::ObjectId inner = 0;
};

// One in-place write on a version counter, by the innermost op that showed it (the outermost
// user-called op is found at report time by walking up the parents). op 0: the counter moved
// between two recorded uses without a recorded write.
// A reset (after < before, which no write has): the counter went back, seen by `op`, which
// started after the last op to show `before` had ended (AnalysisState::reset_previous_ops).
// Nothing records the reset itself (_unsafe_set_version_counter is not an op).
struct Bump {
  format::ObjectId op = 0;
  uint64_t seq = 0;
  uint32_t before = 0;
  uint32_t after = 0;
  format::ObjectId tensor = 0;  // The tensor written through (0 when the writer is unknown).
  // The written storage's ContentLineage after the write (the outermost op's that showed it); 0
  // for resets and unrecorded writes.
  uint64_t content = 0;
  bool IsReset() const { return after < before; }
};

struct CounterState {
  uint32_t first_version = 0;  // version_before at its first recorded use.
  uint64_t first_seq = 0;      // The record that first used it.
  // The first tensor seen with it that requires grad (GradientCutWatch): a view made of it
  // under no_grad reads as a leaf that requires grad, and is not a parameter.
  format::ObjectId first_grad_tensor = 0;
  uint32_t last_version = 0;   // Latest version seen: the highest since the last reset.
  // The first op to show last_version at its end, and when it ended: an op that starts later
  // and sees a lower version saw a reset, not a race between threads.
  format::ObjectId last_op = 0;
  int64_t last_end_ns = 0;
  bool seen = false;
  bool reset_seen = false;     // Some entry of `bumps` is a reset.
  std::vector<Bump> bumps;     // In record order.
};

struct SavedState {
  format::SavedTensor saved;
  // The tensor's metadata at save time (when known).
  bool meta_known = false;
  uint32_t layout = LayoutPool::kNone;
  format::DType dtype = 0;
  format::Device device;
  format::ObjectId grad_fn = 0;  // The tensor's grad_fn at save time.
  // The storage holding its bytes, and where in it, [first, last): the saved tensor's own, or,
  // for a wrapper subclass (a DTensor), the storage of the tensor it wraps.
  format::ObjectId bytes_storage = 0;
  uint64_t byte_first = 0;
  uint64_t byte_last = UINT64_MAX;
  // Writes into its bytes through a tensor with another counter (SilentWriteWatch's list).
  uint32_t silent_head = UINT32_MAX;
  uint32_t silent_tail = UINT32_MAX;
  // --verify-saved: the fingerprint of its bytes at save time and the one taken when backward was
  // about to use it (pending until that execution is checked).
  bool has_fingerprint = false;
  bool use_pending = false;
  format::ObjectId saved_by = 0;  // The op that created the node: its own record follows the save.
  uint64_t save_seq = 0;          // The node's record.
  // Where its bytes were in the recorded process (--verify-saved traces), [first, last); 0 when
  // unknown. `address_watched`: in SilentWriteWatch's addressed list, until its node runs.
  uint64_t address_first = 0;
  uint64_t address_last = 0;
  bool address_watched = false;
  uint64_t hash_at_save = 0;
  uint64_t hash_at_use = 0;
  int64_t save_ns = 0;
  int64_t use_ns = 0;
  // The ContentLineage of its storage when its node was recorded; 0 when the storage is unknown.
  uint64_t content_at_save = 0;
  // A tensor a Python Function's forward left in its ctx's attributes (a saved tensor named
  // "ctx...."): checked only where its backward read it (AnalysisState::stash_reads).
  bool stash = false;
  // Not saved: a tensor a reentrant checkpoint's block read in forward (under
  // CheckpointFunction's apply), which the recomputation in backward reads again as it is then
  // (name 0). Checked as an unchecked saved tensor of the checkpoint's node.
  bool read_by_recompute = false;
  // Ops that wrote to or aliased its bytes since the save (fingerprinted saved tensors only).
  uint32_t touch_head = UINT32_MAX;
  uint32_t touch_tail = UINT32_MAX;
  // Links in its storage's list of watched saved tensors (SilentWriteWatch::Watch/Unwatch).
  uint32_t watch_prev = UINT32_MAX;
  uint32_t watch_next = UINT32_MAX;
};

struct NodeState {
  format::ObjectId id = 0;
  format::InternId name = 0;
  int64_t sequence_nr = -1;
  uint64_t forward_thread = 0;
  format::ObjectId created_by = 0;
  format::ObjectId variable = 0;
  format::SavedSetKind saved_kind = format::SavedSetKind::kExact;
  uint32_t edges_begin = 0, edges_count = 0;   // In AnalysisState::edges.
  uint32_t saved_begin = 0, saved_count = 0;   // In AnalysisState::saved.
  uint64_t last_pass = UINT64_MAX;             // Last backward pass that ran it.
  // Activation checkpointing: the checkpoint's input node its saved tensors recompute from (0
  // when none), and which node of its name it is among that checkpoint's, from 0.
  format::ObjectId checkpoint = 0;
  uint32_t checkpoint_occurrence = 0;
  format::ObjectId last_exec_op = 0;           // Its backward op in that pass.
  bool watched = false;                        // Its saved tensors are in their storages' lists.
};

// A CUDA kernel, copy or memset launched outside any recorded op.
struct LooseKernel {
  format::InternId name = 0;   // 0 for copies and memsets.
  format::CudaCopyKind copy = format::CudaCopyKind::kUnknown;
  int8_t device = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// A violation as found, resolved into a Violation by BuildReport(). kFreed and kUnpackHook are
// found for every execution that threw where they could apply; BuildReport keeps those that
// PyTorch's message (when recorded) confirms.
struct Finding {
  ViolationKind kind = ViolationKind::kVersion;
  uint32_t node = 0;    // Slot in AnalysisState::nodes.
  uint32_t saved = 0;   // Slot in AnalysisState::saved.
  uint32_t current_version = 0;
  // Innermost ops, in order; 0 for an unrecorded write. kDetached: the detach_ op.
  std::vector<format::ObjectId> writers;
  // kFreed: the node's execution in an earlier pass (0 when none was recorded), and that pass.
  format::ObjectId earlier_exec_op = 0;
  uint64_t earlier_pass = UINT64_MAX;
  // kSilent by a counter reset: the reset, and the last op that showed the version before it.
  std::optional<Bump> reset;
  format::ObjectId reset_previous_op = 0;
  bool simulated = false;
  // The saved tensor was used unchecked (IsUncheckedButKnown): its counter moved, PyTorch is
  // silent.
  bool unchecked = false;
  // A write to a parameter (a leaf that requires grad) after the save, when the last write to the
  // saved tensor brought back the lineage it had at the save: the parameter its values came from
  // changed, though the lineage cannot show it (a DTensor's optimizer step writes the wrapper, not
  // the shard the refill copies from).
  format::ObjectId changed_source = 0;
  // Activation checkpointing: the node whose saved tensors backward was recomputing (slot in
  // AnalysisState::nodes) when it read this one; IdIndex::kAbsent otherwise.
  uint32_t recomputing = IdIndex::kAbsent;
  // The saved tensor is the one checkpointing's recomputation in backward saved (the node's own
  // was a placeholder).
  bool recomputed = false;
  // The version to compare against when it is not the saved tensor's own saved_version (a
  // parameter the recomputation saved: its version in forward).
  bool has_baseline = false;
  uint32_t baseline = 0;
  // The victim, when it is not the op that created the node (kCachedMutated: the op whose output
  // selective checkpointing cached).
  format::ObjectId victim_op = 0;
  uint64_t pass = 0;
  format::ObjectId exec_op = 0;
  bool exec_threw = false;
  // The saved tensor's grad_fn when the node ran (what PyTorch names for a saved input).
  format::ObjectId use_grad_fn = 0;
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
  std::vector<std::pair<format::ObjectId, bool>> touches;  // (op, wrote), in order.
  // kUnpackHook, kSilent: what the unpack hook returned when the recorder saw it differ from the
  // saved tensor.
  std::optional<format::UnpackedTensor> unpacked;
  // kSilent: the saved tensor was moved to another storage (`.data =`) between save and use;
  // `writers` holds the op that announced it.
  bool storage_swap = false;
};

// A write into a saved tensor that a counter reset hid and that wrote back what was saved (the
// same lineage: FSDP2's all-gather refilling a parameter it freed after forward). Not a finding.
struct RestoredUse {
  uint32_t node = 0;            // Slot in AnalysisState::nodes.
  uint32_t saved = 0;           // Slot in AnalysisState::saved.
  format::ObjectId writer = 0;  // The last write before the use (innermost op).
  uint64_t pass = 0;
};

// A gradient cut as found (GradientCutWatch), resolved into a GradientCut by BuildReport.
struct CutFinding {
  CutCause cause = CutCause::kNoGrad;
  format::ObjectId op = 0;          // The op that cut the path (innermost); 0 for kNoParameter.
  format::ObjectId checkpoint = 0;  // kReentrantCheckpoint: the CheckpointFunction's op.
  bool raised = false;
  format::ObjectId loss_op = 0;
  std::string message;
  // The parameters it kept from backward (tensor ids, with what BuildReport names them by).
  struct Parameter {
    format::ObjectId tensor = 0;
    std::string name;
    format::InternId module = 0;
  };
  std::vector<Parameter> parameters;
  uint64_t parameter_count = 0;
  uint64_t backward_passes = 0;
};

// The first NaN or Inf as found (NonFiniteWatch), resolved into a NonFinite by BuildReport.
struct NonFiniteFinding {
  NonFiniteCause cause = NonFiniteCause::kOther;
  bool nan = false;
  format::ObjectId op = 0;          // The op that made it (innermost), or the first reader (kData).
  format::ObjectId node = 0;        // A backward op's node (its NodeExecRecord), 0 otherwise.
  format::ObjectId became_nan = 0;  // The op where its Inf turned NaN, 0 when none.
  bool backward = false;
  format::DType dtype = -1;
  float input_max_abs = 0;
  uint64_t step = kNoStep;
  const char* reached = "";
  uint64_t later_ops = 0;
  uint64_t steps = 0;
  static constexpr uint64_t kNoStep = UINT64_MAX;
};

struct AnalysisState {
  uint64_t seq = 0;  // The record being analyzed, from 1.

  // The storages of the tensors Functions stashed on their ctx (SavedState::stash), and, by op,
  // those of them that ops in the op's subtree took as inputs, until the op's own record (a
  // backward op's: until its execution is checked). Empty in programs without such stashes.
  std::unordered_set<format::ObjectId> stash_storages;
  std::unordered_map<format::ObjectId, std::vector<format::ObjectId>> stash_reads;
  // Whether an op in `op`'s subtree read `storage` (a stash's).
  bool StashRead(format::ObjectId op, format::ObjectId storage) const {
    auto it = stash_reads.find(op);
    return it != stash_reads.end() &&
           std::find(it->second.begin(), it->second.end(), storage) != it->second.end();
  }

  // Interned definitions, by id.
  std::vector<std::string> strings;
  std::vector<format::FrameDef> frames;
  std::vector<std::vector<format::InternId>> stacks;
  // The trace's source (1.4), by path; source_bytes: the lines' bytes kept, bounded.
  std::map<std::string, RecordedSource> sources;
  size_t source_bytes = 0;
  // StepRecords: how many, the first's and the last's step numbers.
  uint64_t steps = 0;
  uint64_t first_step = 0;
  uint64_t last_step = 0;
  // The step the records being read belong to: the latest StepRecord's number, and, for traces
  // that mark none, the count of boundaries found by the recorder's own rule (format/SPEC.md,
  // "Steps": after a backward function ran, a top-level op ends that created nodes).
  uint64_t current_step = 0;
  uint64_t inferred_step = 0;
  // Per backward pass: the step it ran in, by StepRecord (kNoStep before the first) and by the
  // rule; which one a report names is decided at the end, once it is known whether the trace has
  // StepRecords.
  static constexpr uint64_t kNoStep = UINT64_MAX;
  struct PassStep {
    uint64_t marked = kNoStep;
    uint64_t inferred = 0;
  };
  std::vector<PassStep> pass_steps;
  // The step of backward pass `pass`, as reports name it; kNoStep when unknown.
  uint64_t StepOfPass(uint64_t pass) const {
    if (pass >= pass_steps.size()) return kNoStep;
    return steps != 0 ? pass_steps[pass].marked : pass_steps[pass].inferred;
  }

  IdIndex index;  // Slots in the tables below, and in SilentWriteWatch's per-storage lists.
  LayoutPool layouts;
  std::vector<OpInfo> ops;
  std::vector<TensorState> tensors;
  std::vector<CounterState> counters;
  std::vector<NodeState> nodes;
  std::vector<format::ObjectId> edges;  // Nodes' edges, by NodeState::edges_begin.
  std::vector<SavedState> saved;        // Nodes' saved tensors, by NodeState::saved_begin.
  std::vector<LooseKernel> loose_kernels;

  // What the analysis found, in the order autograd met (or would have met) it.
  std::vector<Finding> findings;
  // Where the gradient stopped (GradientCutWatch::Finish).
  std::vector<CutFinding> cut_findings;
  // The first NaN or Inf (NonFiniteWatch::Finish), steps a GradScaler skipped, and whether the
  // trace has value ranges at all.
  std::optional<NonFiniteFinding> non_finite;
  uint64_t scaler_skipped_steps = 0;
  bool ranges_recorded = false;
  // Writes to parameters (leaves that require grad), in record order.
  struct ParameterWrite {
    uint64_t seq = 0;
    format::ObjectId op = 0;  // The innermost op that showed it.
    bool wrapper = false;     // Through a wrapper subclass the trace ties to its data (a DTensor).
  };
  std::vector<ParameterWrite> parameter_writes;
  // The trace ties wrapper subclasses to the tensors they wrap (a TensorInfo.inner was seen,
  // format 1.9): a parameter that is no wrapper is a plain tensor whose writes ContentLineage
  // follows.
  bool wrappers_tied = false;
  // Restored saved tensors: how many uses, and the first kMaxRestoredListed.
  static constexpr size_t kMaxRestoredListed = 32;
  uint64_t restored_count = 0;
  std::vector<RestoredUse> restored;

  // PyTorch's version-counter errors: those that came out of a recorded op (C++ exceptions), by
  // the innermost op, and the last other one (what Python saw).
  std::vector<std::pair<format::ObjectId, std::string>> op_errors;
  std::string final_error;
  std::string recording_torch;  // The FileInfo's torch_version, when the caller gave it.
  // Errors whose message is not the version check's: by op (C++ exceptions out of recorded ops),
  // and the program's last one. What a backward that threw for another reason said.
  std::vector<std::pair<format::ObjectId, std::string>> other_op_errors;
  std::string other_final_error;
  // The program's last error when it is not the version check's (an exception Python or C++
  // did not catch, record_error): its type, message, and the top-level op that threw it when
  // that op is the last one recorded before it. Cleared by a later version-check error.
  struct ProgramErrorSeen {
    std::string type;
    std::string message;
    format::ObjectId op = 0;
  };
  std::optional<ProgramErrorSeen> program_error;
  std::unordered_set<format::ObjectId> threw_execs;  // Backward ops whose node threw.
  // Selective activation checkpointing: the op outputs its caching mode kept (a detached alias),
  // in record order, and the ops that threw (id, seq), in record order; both bounded.
  struct CachedOutput {
    format::ObjectId op = 0;      // The op whose output was cached.
    format::ObjectId tensor = 0;  // That output.
    uint32_t version = 0;         // Its version when cached.
    uint64_t seq = 0;
  };
  std::vector<CachedOutput> cached_outputs;
  std::vector<std::pair<format::ObjectId, uint64_t>> threw_ops;
  // Activation checkpointing: how many nodes of a name each checkpoint made (BackwardReplay).
  std::unordered_map<uint64_t, uint32_t> checkpoint_ranks;
  // Storage swaps that bypass the dispatcher (`.data =`, set_data, Module._apply), by tensor: the
  // op that announced it (aten::_has_compatible_shallow_copy_type, which set_data calls first),
  // the record at which the tensor was first seen on another storage, and that storage's lineage.
  struct StorageSwap {
    uint64_t seq = 0;
    format::ObjectId op = 0;
    format::ObjectId storage = 0;
    uint64_t content = 0;
  };
  std::unordered_map<format::ObjectId, std::vector<StorageSwap>> swaps;
  // detach_() calls, by the tensor detached: (seq, op), in record order.
  std::unordered_map<format::ObjectId, std::vector<std::pair<uint64_t, format::ObjectId>>>
      detaches;
  // Per backward pass, the recorded op that entered it: the last top-level op on the thread of
  // its first execution before it (autograd's backward() runs ops of its own first, such as the
  // ones_like of an implicit gradient); 0 when none.
  std::vector<format::ObjectId> pass_entry_ops;
  // Per backward pass, the slot of the first node it ran (IdIndex::kAbsent while none).
  std::vector<uint32_t> pass_roots;
  // Per counter reset, by the seq of its Bump: the last op that showed the version before it.
  std::unordered_map<uint64_t, format::ObjectId> reset_previous_ops;
  // Nodes whose saved tensors the recorder could not see, by node name.
  std::unordered_map<format::InternId, uint64_t> unknown_saved_nodes;

  uint64_t op_count = 0;
  uint64_t exec_count = 0;
  uint64_t pass_count = 0;
  uint64_t bump_count = 0;
  uint64_t data_loss_records = 0;
  uint64_t data_lost = 0;             // Records lost, summed over the data-loss records.
  std::optional<RecordingStop> recording_stopped;  // The recorder's first kRecorder error.
  uint64_t unknown_node_execs = 0;    // Executions of nodes with no NodeRecord.

  // The interned string; "" for an unknown id.
  const std::string& Str(format::InternId id) const {
    static const std::string kEmpty;
    return id < strings.size() ? strings[id] : kEmpty;
  }

  // nullptr when the id was not recorded as that kind.
  const OpInfo* FindOp(format::ObjectId id) const {
    uint32_t slot = index.Find(id, IdKind::kOp);
    return slot == IdIndex::kAbsent ? nullptr : &ops[slot];
  }
  const TensorState* FindTensor(format::ObjectId id) const {
    uint32_t slot = index.Find(id, IdKind::kTensor);
    return slot == IdIndex::kAbsent ? nullptr : &tensors[slot];
  }
  const CounterState* FindCounter(format::ObjectId id) const {
    if (id == 0) return nullptr;
    uint32_t slot = index.Find(id, IdKind::kCounter);
    return slot == IdIndex::kAbsent ? nullptr : &counters[slot];
  }

  // True when `op` ran inside `ancestor` (following recorded parents).
  bool IsDescendant(format::ObjectId op, format::ObjectId ancestor) const {
    for (int depth = 0; op != 0 && depth < 256; ++depth) {
      if (op == ancestor) return true;
      const OpInfo* info = FindOp(op);
      if (info == nullptr) return false;
      op = info->parent;
    }
    return false;
  }
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_ANALYSIS_STATE_H_
