// autograd's backward passes, replayed over the trace; see backward_replay.h.
#include "backward_replay.h"

#include <algorithm>
#include <queue>
#include <utility>

namespace torchrr::replayer {
namespace {

using format::ObjectId;
using format::OpScope;

// The counter's version just before record `seq`.
uint32_t VersionAt(const CounterState& counter, uint64_t seq, uint32_t fallback) {
  auto it = std::lower_bound(counter.bumps.begin(), counter.bumps.end(), seq,
                             [](const Bump& b, uint64_t s) { return b.seq < s; });
  if (it != counter.bumps.begin()) return std::prev(it)->after;
  return counter.seen ? counter.first_version : fallback;
}

// A recomputed saved tensor's place: checkpoint, node name, rank of the node among the
// checkpoint's of that name, member name, list index. Mixing ids into one key: a collision would
// only pair two other members.
uint64_t RecomputeKey(ObjectId checkpoint, format::InternId node_name, uint32_t occurrence,
                      const format::SavedTensor& saved) {
  uint64_t h = checkpoint * 0x9e3779b97f4a7c15ULL;
  for (uint64_t part : {uint64_t{node_name}, uint64_t{occurrence}, uint64_t{saved.name},
                        uint64_t{saved.list_index}}) {
    h = (h ^ part) * 0x100000001b3ULL + (h >> 29);
  }
  return h;
}

bool HasHook(const AnalysisState& state, const NodeState& node, format::SavedHook hook) {
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    if (state.saved[node.saved_begin + i].saved.hook == hook) return true;
  }
  return false;
}

// Bounds the unmatched packed nodes of a program that packs everything (save_on_cpu) and never
// checkpoints.
constexpr size_t kMaxPackedNodes = 1 << 16;

// A finding on a tensor that backward used without PyTorch's version check: the counter moving
// is PyTorch's silence, not its error.
void MarkUnchecked(std::vector<Finding>& findings, size_t from) {
  for (size_t k = from; k < findings.size(); ++k) {
    findings[k].kind = ViolationKind::kSilent;
    findings[k].unchecked = true;
    findings[k].exec_threw = false;
  }
}

}  // namespace

void BackwardReplay::OnNode(uint32_t node_slot) {
  NodeState& node = state_.nodes[node_slot];
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    const format::SavedTensor& saved = state_.saved[node.saved_begin + i].saved;
    if (saved.recompute_from == 0) continue;
    node.checkpoint = saved.recompute_from;
    node.checkpoint_occurrence =
        state_.checkpoint_ranks[RecomputeKey(saved.recompute_from, node.name, 0, {})]++;
    break;
  }
  if (node.checkpoint == 0 && HasHook(state_, node, format::SavedHook::kPackedTensor)) {
    if (packed_nodes_.size() >= kMaxPackedNodes) {
      packed_nodes_.erase(packed_nodes_.begin(), packed_nodes_.begin() + kMaxPackedNodes / 2);
    }
    packed_nodes_.push_back(node_slot);
  }
}

// A top-level op that is neither a backward function nor an autograd engine wrapper is forward
// work: the thread that ran it is done with the backward passes it ran or built the graph of
// (backward() blocks its caller until the pass ends, and CPU nodes run on the caller's thread).
// An op the user called (it has a stack) on a thread running no pass may be how the next pass
// there was entered; one inside a pass (a hook's) is not.
void BackwardReplay::OnForwardOp(const format::OpRecord& r) {
  const bool called = r.stack != 0 && r.scope == OpScope::kFunction;
  if (!called && (r.parent != 0 || open_passes_.empty())) return;
  if (r.scope == OpScope::kBackwardFunction || IsAutogradEngineName(state_.Str(r.name))) return;
  bool in_pass = false;
  for (size_t i = open_passes_.size(); i-- > 0;) {
    const Pass& pass = open_passes_[i];
    if (r.parent == 0 && (pass.Ran(r.thread) || pass.Built(r.thread))) {
      EndPass(i);
    } else if (pass.Ran(r.thread)) {
      in_pass = true;
    }
  }
  if (!called || in_pass) return;
  last_called_op_[r.thread] = r.op;
}

void BackwardReplay::OnBackwardOp(const format::OpRecord& r, uint64_t subtree_first) {
  PendingExec& exec = pending_execs_[r.op];
  exec.start_seq = subtree_first;
  exec.have_op = true;
  if (!exec.have_exec) exec.record_seq = state_.seq;
  if (exec.have_exec) {
    PendingExec done = exec;
    pending_execs_.erase(r.op);
    RunExec(r.op, done);
  }
}

void BackwardReplay::OnNodeExec(const format::NodeExecRecord& r) {
  PendingExec& exec = pending_execs_[r.op];
  exec.node = r.node;
  exec.thread = r.thread;
  exec.threw = r.threw;
  exec.unpacked = r.unpacked;
  exec.have_exec = true;
  if (!exec.have_op) exec.record_seq = exec.start_seq = state_.seq;
  if (exec.have_op) {
    PendingExec done = exec;
    pending_execs_.erase(r.op);
    RunExec(r.op, done);
  }
}

void BackwardReplay::Finish() {
  // Executions whose other half never came (a truncated trace): run them as they are.
  std::vector<std::pair<ObjectId, PendingExec>> pending(pending_execs_.begin(),
                                                        pending_execs_.end());
  std::sort(pending.begin(), pending.end(),
            [](const auto& a, const auto& b) { return a.second.record_seq < b.second.record_seq; });
  for (auto& [op, exec] : pending) {
    if (exec.have_exec) RunExec(op, exec);
  }
  pending_execs_.clear();
  while (!open_passes_.empty()) EndPass(0);
}

bool BackwardReplay::Pass::Ran(uint32_t thread) const {
  return std::find(threads.begin(), threads.end(), thread) != threads.end();
}

bool BackwardReplay::Pass::Built(uint64_t thread) const {
  return std::find(builders.begin(), builders.end(), thread) != builders.end();
}

// The pass rule: the open pass a node execution belongs to, or nullptr for a new one.
//   - A pass that threw is closed at once (PyTorch abandons a pass at its first error), and so
//     is every pass that ran on a thread, or whose graph a thread built, once that thread does
//     forward work (OnForwardOp).
//   - A pass in which the node already ran is not it (backward twice over a retained graph).
//   - The pass open on the execution's thread (a thread runs one backward() at a time; CPU nodes
//     run on the caller's thread), or, when several are (a device's worker thread serving
//     several callers), the latest whose nodes reach this one. The latest one having run the
//     node means a new pass.
//   - With none on its thread, a pass whose nodes reach this one: a device's worker thread, or
//     the caller's, joining a pass that began on the other.
BackwardReplay::Pass* BackwardReplay::FindPass(uint32_t node_slot, uint32_t thread) {
  const uint64_t last_pass =
      node_slot == IdIndex::kAbsent ? UINT64_MAX : state_.nodes[node_slot].last_pass;
  Pass* latest_here = nullptr;
  bool several_here = false;
  for (size_t i = open_passes_.size(); i-- > 0;) {
    if (!open_passes_[i].Ran(thread)) continue;
    if (latest_here != nullptr) {
      several_here = true;
      break;
    }
    latest_here = &open_passes_[i];
  }
  if (latest_here != nullptr && several_here && node_slot != IdIndex::kAbsent) {
    for (size_t i = open_passes_.size(); i-- > 0;) {
      Pass& pass = open_passes_[i];
      if (pass.Ran(thread) && pass.index != last_pass && Reaches(pass, node_slot)) return &pass;
    }
  }
  if (latest_here != nullptr) return latest_here->index == last_pass ? nullptr : latest_here;
  if (node_slot == IdIndex::kAbsent) return nullptr;
  for (size_t i = open_passes_.size(); i-- > 0;) {
    Pass& pass = open_passes_[i];
    if (pass.index != last_pass && Reaches(pass, node_slot)) return &pass;
  }
  return nullptr;
}

// True when a node the pass ran has an edge to the node: a node runs once a consumer in its
// pass passed it a gradient, so every node of a pass but its roots is reached this way. Walks
// the pass's nodes: it runs once per pass and thread joining it, or for a worker thread that
// several passes share.
bool BackwardReplay::Reaches(const Pass& pass, uint32_t node_slot) const {
  const format::ObjectId id = state_.nodes[node_slot].id;
  for (uint32_t slot : pass.executed) {
    const NodeState& node = state_.nodes[slot];
    for (uint32_t e = 0; e < node.edges_count; ++e) {
      if (state_.edges[node.edges_begin + e] == id) return true;
    }
  }
  return false;
}

BackwardReplay::Pass& BackwardReplay::OpenPass(uint32_t node_slot, uint32_t thread) {
  // 256: passes a trace keeps open at once (one per thread calling backward, and passes on
  // threads that never ran forward work again); past that the oldest is done.
  if (open_passes_.size() >= 256) EndPass(0);
  Pass& pass = open_passes_.emplace_back();
  pass.index = state_.pass_count++;
  pass.root = node_slot;
  ObjectId entry = 0;
  if (auto called = last_called_op_.find(thread); called != last_called_op_.end()) {
    entry = called->second;
    last_called_op_.erase(called);
  }
  state_.pass_entry_ops.push_back(entry);
  state_.pass_roots.push_back(node_slot);
  state_.pass_steps.push_back(
      {state_.steps != 0 ? state_.current_step : AnalysisState::kNoStep, state_.inferred_step});
  return pass;
}

void BackwardReplay::RunExec(ObjectId exec_op, const PendingExec& exec) {
  ++state_.exec_count;
  uint32_t slot = state_.index.Find(exec.node, IdKind::kNode);
  Pass* found = FindPass(slot, exec.thread);
  Pass& pass = found != nullptr ? *found : OpenPass(slot, exec.thread);
  if (!pass.Ran(exec.thread)) pass.threads.push_back(exec.thread);
  if (slot == IdIndex::kAbsent) {
    // Node 0: the recorder could not tell which node ran (a backward called outside autograd's
    // engine, or AccumulateGrad and GraphRoot in traces whose recorder did not name them; those
    // save nothing): there is nothing to check.
    if (exec.node != 0) ++state_.unknown_node_execs;
  } else {
    if (pass.root == IdIndex::kAbsent) {
      pass.root = slot;
      if (pass.index < state_.pass_roots.size()) state_.pass_roots[pass.index] = slot;
    }
    NodeState& node = state_.nodes[slot];
    const uint64_t earlier_pass = node.last_pass;
    const ObjectId earlier_exec_op = node.last_exec_op;
    node.last_pass = pass.index;
    node.last_exec_op = exec_op;
    pass.executed.push_back(slot);
    // A leaf's AccumulateGrad belongs to no one forward op: its thread says nothing.
    if (!IsAccumulateGrad(node) && node.sequence_nr >= 0 && !pass.Built(node.forward_thread)) {
      pass.builders.push_back(node.forward_thread);
    }
    CheckNode(slot, exec.start_seq, /*simulated=*/false, exec_op, exec.threw, pass);
    if (exec.threw) {
      AddThrowFindings(slot, exec_op, pass.index, earlier_pass, earlier_exec_op, exec.unpacked);
    } else if (!exec.unpacked.empty()) {
      AddUnpackedFindings(slot, exec_op, pass.index, exec.unpacked);
    }
    silent_.Unwatch(slot);
  }
  if (!state_.stash_reads.empty()) state_.stash_reads.erase(exec_op);
  if (exec.threw) {
    pass.threw = true;
    pass.stop_seq = exec.record_seq;
    state_.threw_execs.insert(exec_op);
    EndPass(static_cast<size_t>(&pass - open_passes_.data()));
  }
}

// An execution threw for a reason the version checks above do not show; what only PyTorch's
// message can confirm (BuildReport keeps the one it names):
//   - freed: the node ran in an earlier pass, which (without retain_graph) freed what it saved;
//   - unpack_hook: it saved through saved_tensors_hooks, and backward failed on what the unpack
//     hook returned (PyTorch checks neither its shape, nor its dtype, nor its version).
void BackwardReplay::AddThrowFindings(uint32_t node_slot, ObjectId exec_op, uint64_t pass,
                                      uint64_t earlier_pass, ObjectId earlier_exec_op,
                                      const std::vector<format::UnpackedTensor>& unpacked) {
  AddCachedMutated(node_slot, exec_op, pass);
  const NodeState& node = state_.nodes[node_slot];
  uint32_t first_defined = UINT32_MAX, first_hooked = UINT32_MAX;
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    const format::SavedTensor& saved = state_.saved[node.saved_begin + i].saved;
    if (!saved.defined) continue;
    if (first_defined == UINT32_MAX) first_defined = node.saved_begin + i;
    // A checkpoint's placeholder is not what backward failed on: the recomputation's errors
    // (selective checkpointing's "cached ... mutated" among them) are checkpointing's own.
    if (saved.has_hooks && saved.hook != format::SavedHook::kCheckpoint &&
        first_hooked == UINT32_MAX) {
      first_hooked = node.saved_begin + i;
    }
  }
  if (first_defined == UINT32_MAX) return;  // Saved nothing: nothing to free or unpack.
  Finding base;
  base.node = node_slot;
  base.pass = pass;
  base.exec_op = exec_op;
  base.exec_threw = true;
  Finding freed = base;
  freed.kind = ViolationKind::kFreed;
  freed.saved = first_defined;
  freed.current_version = state_.saved[first_defined].saved.saved_version;
  freed.earlier_exec_op = earlier_exec_op;
  freed.earlier_pass = earlier_pass;
  state_.findings.push_back(std::move(freed));
  if (first_hooked == UINT32_MAX) return;
  Finding hooked = base;
  hooked.kind = ViolationKind::kUnpackHook;
  hooked.saved = first_hooked;
  // The tensor the recorder saw a hook hand back unlike the saved one is the likelier cause.
  if (!unpacked.empty() && unpacked.front().saved < node.saved_count) {
    hooked.saved = node.saved_begin + unpacked.front().saved;
    hooked.unpacked = unpacked.front();
  }
  hooked.current_version = state_.saved[hooked.saved].saved.saved_version;
  state_.findings.push_back(std::move(hooked));
}

// The recorder compares what a Python unpack hook returns with the dtype and shape autograd kept
// for the saved tensor, since PyTorch compares neither: the formula runs on whatever the hook
// returns, and the engine then casts each gradient to its input's dtype (and reduces a
// broadcast one to its shape), so another dtype or shape that does not make the formula throw
// gives a gradient computed from other values, and no error. Comparing in the replayer instead
// (the backward op's recorded inputs) would need the ops inside backward functions, which are
// not recorded unless --all-ops, and would not tell which input is the unpacked tensor.
void BackwardReplay::AddUnpackedFindings(uint32_t node_slot, ObjectId exec_op, uint64_t pass,
                                         const std::vector<format::UnpackedTensor>& unpacked) {
  const NodeState& node = state_.nodes[node_slot];
  for (const format::UnpackedTensor& u : unpacked) {
    if (u.saved >= node.saved_count) continue;
    Finding f;
    f.kind = ViolationKind::kSilent;
    f.node = node_slot;
    f.saved = node.saved_begin + u.saved;
    f.current_version = state_.saved[f.saved].saved.saved_version;
    f.pass = pass;
    f.exec_op = exec_op;
    f.unpacked = u;
    state_.findings.push_back(std::move(f));
  }
}

// Selective activation checkpointing: the recomputation inside the execution threw in an op
// (the innermost that threw) whose output the forward's caching mode kept; when that cached output
// was written after it was cached, PyTorch's "cached ... has been mutated" is about it. Kept only
// when PyTorch's message says so (ReportBuilder).
void BackwardReplay::AddCachedMutated(uint32_t node_slot, ObjectId exec_op, uint64_t pass) {
  if (state_.cached_outputs.empty()) return;
  ObjectId thrown = 0;
  uint64_t thrown_seq = 0;
  const auto& threw = state_.threw_ops;
  for (size_t i = threw.size(), seen = 0; i-- > 0 && seen < 64; ++seen) {
    if (threw[i].first != exec_op && state_.IsDescendant(threw[i].first, exec_op)) {
      thrown = threw[i].first;  // Earlier records are inner ops: keep going.
      thrown_seq = threw[i].second;
    }
  }
  const OpInfo* thrown_info = state_.FindOp(thrown);
  if (thrown_info == nullptr) return;
  const auto& cached = state_.cached_outputs;
  for (size_t i = cached.size(); i-- > 0;) {
    const AnalysisState::CachedOutput& c = cached[i];
    if (c.seq >= thrown_seq || state_.IsDescendant(c.op, exec_op)) continue;
    const OpInfo* op = state_.FindOp(c.op);
    const TensorState* tensor = state_.FindTensor(c.tensor);
    if (op == nullptr || op->name != thrown_info->name || tensor == nullptr) continue;
    const CounterState* counter = state_.FindCounter(tensor->counter);
    if (counter == nullptr) continue;
    const uint32_t current = VersionAt(*counter, thrown_seq, c.version);
    if (current == c.version) continue;
    SavedState s;  // What the cache kept, as a saved tensor of no node.
    s.saved.tensor = c.tensor;
    s.saved.version_counter = tensor->counter;
    s.saved.storage = tensor->storage;
    s.bytes_storage = tensor->storage;
    s.saved.saved_version = c.version;
    s.saved_by = c.op;
    s.meta_known = true;
    s.layout = tensor->layout;
    s.dtype = tensor->dtype;
    s.device = tensor->device;
    s.grad_fn = tensor->grad_fn;
    Finding f;
    f.kind = ViolationKind::kCachedMutated;
    f.node = node_slot;
    f.saved = static_cast<uint32_t>(state_.saved.size());
    f.current_version = current;
    f.pass = pass;
    f.exec_op = exec_op;
    f.exec_threw = true;
    f.victim_op = c.op;
    for (const Bump& b : counter->bumps) {
      if (b.seq > c.seq && b.seq < thrown_seq && b.after > c.version) f.writers.push_back(b.op);
    }
    state_.saved.push_back(s);
    state_.findings.push_back(std::move(f));
    return;
  }
}

// autograd's SavedVariable::unpack check for every saved tensor of the node, at record `seq`.
void BackwardReplay::CheckNode(uint32_t node_slot, uint64_t seq, bool simulated, ObjectId exec_op,
                               bool threw, Pass& pass, uint32_t recomputing) {
  const NodeState& node = state_.nodes[node_slot];
  // Generated nodes unpack a saved input without the node (custom Functions and saved outputs
  // pass it), so only there does a detached one raise.
  const bool unpacks_inputs_alone = node.saved_kind == format::SavedSetKind::kExact;
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    uint32_t saved_slot = node.saved_begin + i;
    SavedState& s = state_.saved[saved_slot];
    Finding base;
    base.node = node_slot;
    base.saved = saved_slot;
    base.simulated = simulated;
    base.recomputing = recomputing;
    base.pass = pass.index;
    base.exec_op = exec_op;
    base.exec_threw = threw;
    if (s.saved.recompute_from != 0) {
      CheckRecomputeInputs(s.saved.recompute_from, node_slot, seq, simulated, exec_op, threw,
                           pass);
      if (!simulated) CheckRecomputed(node_slot, s, base, seq, pass);
      continue;
    }
    const bool unchecked = IsUncheckedButKnown(s.saved);
    if (!IsVersionChecked(s.saved) && !unchecked) continue;
    // A ctx attribute's tensor matters where backward read it: a write to a stash it never
    // reads, or one made by its own backward after the read, changes no gradient.
    if (s.stash && (simulated || !state_.StashRead(exec_op, s.bytes_storage))) continue;
    const size_t findings_before = state_.findings.size();
    base.current_version = s.saved.saved_version;
    if (const TensorState* t = state_.FindTensor(s.saved.tensor)) {
      base.use_known = true;
      base.use_grad_fn = t->is_leaf ? 0 : t->grad_fn;
      base.use_output_nr = t->output_nr;
    }
    if (unpacks_inputs_alone && !unchecked) CheckDetached(s, base, seq);
    CheckVersion(s, base, seq);
    CheckStorageSwap(s, base, seq);
    if (unchecked) MarkUnchecked(state_.findings, findings_before);
    std::vector<ObjectId> silent_writers = silent_.SilentWritersBefore(s, seq);
    if (!silent_writers.empty()) {
      Finding f = base;
      f.kind = ViolationKind::kSilent;
      f.writers = std::move(silent_writers);
      state_.findings.push_back(std::move(f));
    }
    if (!simulated && s.use_pending) CheckFingerprint(s, base, seq, findings_before);
  }
}

void BackwardReplay::CheckRecomputeInputs(ObjectId inputs_node, uint32_t node_slot, uint64_t seq,
                                          bool simulated, ObjectId exec_op, bool threw,
                                          Pass& pass) {
  uint32_t inputs_slot = state_.index.Find(inputs_node, IdKind::kNode);
  if (inputs_slot == IdIndex::kAbsent || inputs_slot == node_slot) return;
  std::vector<uint32_t>& read = pass.recomputed_inputs;
  if (std::find(read.begin(), read.end(), inputs_slot) != read.end()) return;
  read.push_back(inputs_slot);
  if (!simulated) ClaimRecomputation(inputs_node, exec_op, pass);
  CheckNode(inputs_slot, seq, simulated, exec_op, threw, pass, node_slot);
}

void BackwardReplay::ClaimRecomputation(ObjectId inputs_node, ObjectId exec_op, Pass& pass) {
  std::unordered_map<format::InternId, uint32_t> ranks;
  std::vector<uint32_t> keep;
  for (uint32_t slot : packed_nodes_) {
    const NodeState& node = state_.nodes[slot];
    if (node.created_by != 0 && state_.IsDescendant(node.created_by, exec_op)) {
      const uint32_t rank = ranks[node.name]++;
      for (uint32_t i = 0; i < node.saved_count; ++i) {
        const format::SavedTensor& saved = state_.saved[node.saved_begin + i].saved;
        if (saved.hook != format::SavedHook::kPackedTensor) continue;
        pass.recomputed[RecomputeKey(inputs_node, node.name, rank, saved)] = node.saved_begin + i;
      }
    } else if (node.created_by == 0 || state_.FindOp(node.created_by) == nullptr) {
      keep.push_back(slot);  // Its op is still running: maybe a recomputation not checked yet.
    }
  }
  packed_nodes_ = std::move(keep);
}

void BackwardReplay::CheckRecomputed(uint32_t node_slot, const SavedState& s, const Finding& base,
                                     uint64_t seq, const Pass& pass) {
  const NodeState& node = state_.nodes[node_slot];
  auto it = pass.recomputed.find(
      RecomputeKey(s.saved.recompute_from, node.name, node.checkpoint_occurrence, s.saved));
  if (it == pass.recomputed.end()) return;
  // A tensor the forward had too (a parameter, a view of one), whose counter predates the
  // recomputation: a write in between (an optimizer step) makes the recomputation differ from
  // the forward, so the baseline is its version in forward. Tensors new in the recomputation are
  // compared with their version when it saved them.
  SavedState recomputed = state_.saved[it->second];
  Finding f = base;
  const CounterState* counter = state_.FindCounter(recomputed.saved.version_counter);
  if (counter != nullptr && counter->first_seq < seq) {
    recomputed.saved.saved_version = s.saved.saved_version;
    recomputed.content_at_save = s.content_at_save;  // What forward saw, as for the version.
    f.has_baseline = true;
    f.baseline = s.saved.saved_version;
  }
  f.saved = it->second;
  f.recomputed = true;
  f.current_version = recomputed.saved.saved_version;
  if (const TensorState* t = state_.FindTensor(recomputed.saved.tensor)) {
    f.use_known = true;
    f.use_grad_fn = t->is_leaf ? 0 : t->grad_fn;
    f.use_output_nr = t->output_nr;
  }
  const size_t findings_before = state_.findings.size();
  CheckVersion(recomputed, f, seq);
  MarkUnchecked(state_.findings, findings_before);
  // A write that moves no counter of the recomputed tensor's: through another tensor on its
  // storage, or through another storage over its bytes (a DLPack alias the recomputation made
  // again; --verify-saved traces have the addresses). Backward uses what it left.
  std::vector<ObjectId> writers = silent_.SilentWritersBefore(recomputed, seq);
  for (const auto& [op, wrote] : silent_.TouchesBefore(recomputed, seq)) {
    if (wrote && std::find(writers.begin(), writers.end(), op) == writers.end()) {
      writers.push_back(op);
    }
  }
  // The recomputed tensor is used now, once: no longer watched by address (its node never runs
  // to be unwatched).
  state_.saved[it->second].address_watched = false;
  if (!writers.empty()) {
    f.kind = ViolationKind::kSilent;
    f.writers = std::move(writers);
    state_.findings.push_back(std::move(f));
  }
}

// SavedVariable::unpack's first check: a saved input (not a leaf) whose grad_fn is gone because
// detach_() ran on it after the save ("Trying to use a saved tensor that has been detached").
void BackwardReplay::CheckDetached(const SavedState& s, const Finding& base, uint64_t seq) {
  if (s.saved.is_output || s.saved.is_leaf || s.saved.tensor == 0) return;
  auto it = state_.detaches.find(s.saved.tensor);
  if (it == state_.detaches.end()) return;
  for (const auto& [detach_seq, op] : it->second) {
    if (detach_seq <= s.save_seq) continue;
    if (detach_seq >= seq) return;
    Finding f = base;
    f.kind = ViolationKind::kDetached;
    f.writers.push_back(op);
    state_.findings.push_back(std::move(f));
    return;
  }
}

// The version check proper: the saved tensor's counter moved between the save and record `seq`.
// A counter set back after writes that followed the save (a reset entry) passes the check while
// the bytes are not the saved ones: a silent violation, its writes the culprits.
void BackwardReplay::CheckVersion(const SavedState& s, const Finding& base, uint64_t seq) {
  const CounterState* counter = state_.FindCounter(s.saved.version_counter);
  if (counter == nullptr) return;
  uint32_t current = VersionAt(*counter, seq, s.saved.saved_version);
  // Without a reset, versions only grow: an unchanged version is the saved one, and the writes
  // need not be walked (a parameter's counter grows with every step).
  if (current == s.saved.saved_version && !counter->reset_seen) return;
  // Entries before the last reset ahead of the save wrote what the save then kept.
  size_t begin = 0;
  for (size_t i = 0; counter->reset_seen && i < counter->bumps.size() &&
                     counter->bumps[i].seq < s.save_seq;
       ++i) {
    if (counter->bumps[i].IsReset()) begin = i + 1;
  }
  std::vector<ObjectId> writers;
  const Bump* last = nullptr;
  const Bump* reset = nullptr;  // The first reset that hid a write since the save.
  bool past_reset = false;
  for (size_t i = begin; i < counter->bumps.size(); ++i) {
    const Bump& b = counter->bumps[i];
    if (b.seq >= seq) break;
    if (b.IsReset()) {
      if (reset == nullptr && !writers.empty()) reset = &b;
      past_reset = true;
      continue;
    }
    // Before any reset, versions only grow: a write that took the counter past the saved
    // version came after the save. After one, every write did.
    if (past_reset || b.after > s.saved.saved_version) writers.push_back(b.op);
    last = &b;
  }
  if (current == s.saved.saved_version && reset == nullptr) return;
  // The last write put back what the save kept (ContentLineage): FSDP2 refilling a parameter it
  // freed, under a preserved counter, whether or not an op showed the counter going back before
  // the use (the refill comes just before the node runs). PyTorch's check passed or never looked,
  // and backward reads the saved bytes; unless a parameter was written in between, which the
  // lineage may not follow.
  const bool put_back = PutBack(s, base, last);
  const ObjectId changed_source = put_back ? ParameterWrittenBetween(s.save_seq, seq) : 0;
  if (put_back && changed_source == 0) {
    NoteRestored(base, last->op);
    return;
  }
  Finding f = base;
  f.changed_source = changed_source;
  f.writers = std::move(writers);
  if (current == s.saved.saved_version) {
    f.kind = ViolationKind::kSilent;
    f.reset = *reset;
    auto previous = state_.reset_previous_ops.find(reset->seq);
    if (previous != state_.reset_previous_ops.end()) f.reset_previous_op = previous->second;
    state_.findings.push_back(std::move(f));
    return;
  }
  f.kind = ViolationKind::kVersion;
  f.current_version = current;
  // A view written through another tensor sharing its counter (its base or another view) keeps a
  // stale grad_fn: PyTorch regenerates it as AsStridedBackward0 when it raises, and names that.
  // (A base written through a view got CopySlices instead, which the trace shows as a changed
  // grad_fn.)
  f.view_regenerated = f.use_known && f.use_grad_fn != 0 && s.meta_known &&
                       f.use_grad_fn == s.grad_fn && last != nullptr && last->tensor != 0 &&
                       last->tensor != s.saved.tensor;
  state_.findings.push_back(std::move(f));
}

// `.data =` on a saved tensor between its save and record `seq`: backward reads the tensor's new
// storage, and no version counter moved. A swap back to what was saved (the same lineage: a
// sharded engine swapping an unsharded parameter in again) is none.
void BackwardReplay::CheckStorageSwap(const SavedState& s, const Finding& base, uint64_t seq) {
  if (s.saved.tensor == 0 || s.saved.storage == 0) return;
  auto it = state_.swaps.find(s.saved.tensor);
  if (it == state_.swaps.end()) return;
  const AnalysisState::StorageSwap* first = nullptr;
  const AnalysisState::StorageSwap* last = nullptr;
  for (const AnalysisState::StorageSwap& swap : it->second) {
    if (swap.seq <= s.save_seq) continue;
    if (swap.seq >= seq) break;
    if (first == nullptr) first = &swap;
    last = &swap;
  }
  if (last == nullptr) return;
  // Storage ids are reused once freed: the lineage says whether it is what was saved.
  const bool back = s.content_at_save != 0 && last->content != 0
                        ? last->content == s.content_at_save
                        : last->storage == s.saved.storage;
  if (back && !base.exec_threw) return;
  Finding f = base;
  f.kind = ViolationKind::kSilent;
  f.storage_swap = true;
  f.writers.push_back(first->op);
  state_.findings.push_back(std::move(f));
}

bool BackwardReplay::PutBack(const SavedState& s, const Finding& base, const Bump* last) const {
  return last != nullptr && last->content != 0 && last->content == s.content_at_save &&
         !base.exec_threw;
}

ObjectId BackwardReplay::ParameterWrittenBetween(uint64_t after_seq, uint64_t before_seq) const {
  const auto& writes = state_.parameter_writes;
  auto it = std::upper_bound(writes.begin(), writes.end(), after_seq,
                             [](uint64_t seq, const auto& write) { return seq < write.seq; });
  // Where the trace ties wrappers to their data, a plain parameter's write changed what the
  // refill copied only if the lineage says so; a DTensor's may have changed its shard unseen.
  for (; it != writes.end() && it->seq < before_seq; ++it) {
    if (it->wrapper || !state_.wrappers_tied) return it->op;
  }
  return 0;
}

void BackwardReplay::NoteRestored(const Finding& base, ObjectId writer) {
  ++state_.restored_count;
  if (state_.restored.size() >= AnalysisState::kMaxRestoredListed) return;
  state_.restored.push_back({base.node, base.saved, writer, base.pass});
}

// --verify-saved: bytes that changed between the save and this use. A change that a finding
// above already explains (a version bump, a write through .data) only adds the hashes to it;
// an unexplained one is a silent write by something the recorder could not see.
void BackwardReplay::CheckFingerprint(SavedState& s, const Finding& base, uint64_t seq,
                                      size_t findings_before) {
  s.use_pending = false;
  if (s.hash_at_use == s.hash_at_save) return;
  auto add_hashes = [&](Finding& f) {
    f.has_hashes = true;
    f.hash_at_save = s.hash_at_save;
    f.hash_at_use = s.hash_at_use;
    f.save_ns = s.save_ns;
    f.use_ns = s.use_ns;
  };
  std::vector<Finding>& findings = state_.findings;
  if (findings.size() > findings_before) {
    for (size_t i = findings_before; i < findings.size(); ++i) add_hashes(findings[i]);
    return;
  }
  Finding f = base;
  f.kind = ViolationKind::kSilent;
  f.by_fingerprint = true;
  add_hashes(f);
  f.touches = silent_.TouchesBefore(s, seq);
  findings.push_back(std::move(f));
}

bool BackwardReplay::IsAccumulateGrad(const NodeState& node) const {
  return node.variable != 0 || node.sequence_nr == INT64_MAX ||
         state_.Str(node.name).find("AccumulateGrad") != std::string::npos;
}

// Closes an open pass. When it threw, runs the rest of it as autograd would have: the nodes
// reachable from its root, each once all its consumers in that graph ran, highest sequence_nr
// first (AccumulateGrad first of all), each checked as of the moment the pass stopped.
void BackwardReplay::EndPass(size_t open_index) {
  Pass pass = std::move(open_passes_[open_index]);
  open_passes_.erase(open_passes_.begin() + static_cast<std::ptrdiff_t>(open_index));
  if (pass.threw && pass.root != IdIndex::kAbsent) SimulateRest(pass);
}

void BackwardReplay::SimulateRest(Pass& pass) {
  const std::vector<NodeState>& nodes = state_.nodes;
  const IdIndex& index = state_.index;
  std::unordered_map<uint32_t, uint32_t> local;  // Node slot -> index in graph.
  std::vector<uint32_t> graph{pass.root};
  local.emplace(pass.root, 0);
  for (size_t i = 0; i < graph.size(); ++i) {
    const NodeState& node = nodes[graph[i]];
    for (uint32_t e = 0; e < node.edges_count; ++e) {
      uint32_t next = index.Find(state_.edges[node.edges_begin + e], IdKind::kNode);
      if (next == IdIndex::kAbsent) continue;
      if (local.try_emplace(next, static_cast<uint32_t>(graph.size())).second) {
        graph.push_back(next);
      }
    }
  }
  std::vector<uint32_t> pending_inputs(graph.size(), 0);
  std::vector<bool> ran(graph.size(), false);
  for (uint32_t slot : graph) {
    const NodeState& node = nodes[slot];
    for (uint32_t e = 0; e < node.edges_count; ++e) {
      auto it = local.find(index.Find(state_.edges[node.edges_begin + e], IdKind::kNode));
      if (it != local.end()) ++pending_inputs[it->second];
    }
  }
  auto priority = [this, &graph, &nodes](uint32_t a, uint32_t b) {  // True when b runs first.
    const NodeState& na = nodes[graph[a]];
    const NodeState& nb = nodes[graph[b]];
    bool acc_a = IsAccumulateGrad(na), acc_b = IsAccumulateGrad(nb);
    if (acc_a != acc_b) return acc_b;
    if (na.sequence_nr != nb.sequence_nr) return na.sequence_nr < nb.sequence_nr;
    return na.id > nb.id;
  };
  std::priority_queue<uint32_t, std::vector<uint32_t>, decltype(priority)> ready(priority);
  auto finish = [&](uint32_t g) {
    ran[g] = true;
    const NodeState& node = nodes[graph[g]];
    for (uint32_t e = 0; e < node.edges_count; ++e) {
      auto it = local.find(index.Find(state_.edges[node.edges_begin + e], IdKind::kNode));
      if (it == local.end()) continue;
      if (--pending_inputs[it->second] == 0 && !ran[it->second]) ready.push(it->second);
    }
  };
  std::vector<bool> executed(graph.size(), false);
  for (uint32_t slot : pass.executed) {
    if (auto it = local.find(slot); it != local.end()) executed[it->second] = true;
  }
  for (uint32_t slot : pass.executed) {
    auto it = local.find(slot);
    if (it != local.end() && !ran[it->second]) finish(it->second);
  }
  while (!ready.empty()) {
    uint32_t g = ready.top();
    ready.pop();
    if (ran[g] || executed[g]) continue;
    CheckNode(graph[g], pass.stop_seq, /*simulated=*/true, 0, false, pass);
    finish(g);
  }
}

}  // namespace torchrr::replayer
