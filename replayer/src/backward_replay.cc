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
// checkpoint's of that name, member name, list index.
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

}  // namespace

void BackwardReplay::OnNode(uint32_t node_slot) {
  NodeState& node = state_.nodes[node_slot];
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    const format::SavedTensor& saved = state_.saved[node.saved_begin + i].saved;
    if (saved.recompute_from == 0) continue;
    node.checkpoint = saved.recompute_from;
    // Mixing 64-bit ids into one key: a collision would only pair two other members.
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

void BackwardReplay::OnForwardOp(const format::OpRecord& r) {
  if (!pass_open_ || forward_seen_) return;
  if (r.scope == OpScope::kBackwardFunction || IsAutogradEngineName(state_.Str(r.name))) return;
  if (r.parent == 0) {
    forward_seen_ = true;
  } else {
    candidates_.push_back({r.op, r.thread});
  }
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
  EndPass();
}

// The pass rule. A node execution starts a new backward pass when
//   - no pass is open, or the open one threw (PyTorch abandons a pass at its first error);
//   - forward work ran since the pass's last execution: a top-level op (parent 0) that is
//     neither a backward function nor an autograd engine wrapper, or a nested op whose chain of
//     parents reaches no backward function (on the executing thread, or on a thread that ran no
//     node of this pass, since a thread running nodes has backward ops still open);
//   - the node already ran in the open pass (backward twice over a retained graph).
bool BackwardReplay::NewPassNeeded(uint32_t node_slot, ObjectId exec_op, uint32_t thread) {
  if (!pass_open_ || pass_threw_ || forward_seen_) return true;
  if (node_slot != IdIndex::kAbsent && state_.nodes[node_slot].last_pass == pass_index_) {
    return true;
  }
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

// Where `op`'s chain of parents leads: to the top level (forward work), into a backward function
// or `exec_op` (backward work), or to an op not recorded yet (still open).
BackwardReplay::Chain BackwardReplay::Classify(ObjectId op, ObjectId exec_op) const {
  const OpInfo* info = state_.FindOp(op);
  for (int depth = 0; info != nullptr && depth < 256; ++depth) {
    ObjectId parent = info->parent;
    if (parent == 0) return Chain::kForward;
    if (parent == exec_op) return Chain::kBackward;
    info = state_.FindOp(parent);
    if (info == nullptr) return Chain::kOpen;
    if (info->scope == OpScope::kBackwardFunction || IsAutogradEngineName(state_.Str(info->name))) {
      return Chain::kBackward;
    }
  }
  return Chain::kOpen;
}

void BackwardReplay::RunExec(ObjectId exec_op, const PendingExec& exec) {
  ++state_.exec_count;
  uint32_t slot = state_.index.Find(exec.node, IdKind::kNode);
  if (NewPassNeeded(slot, exec_op, exec.thread)) {
    EndPass();
    pass_open_ = true;
    pass_index_ = state_.pass_count++;
    pass_root_ = slot;
  }
  forward_seen_ = false;
  candidates_.clear();
  if (std::find(pass_threads_.begin(), pass_threads_.end(), exec.thread) == pass_threads_.end()) {
    pass_threads_.push_back(exec.thread);
  }
  if (slot == IdIndex::kAbsent) {
    // Node 0: the recorder could not tell which node ran (a backward called outside autograd's
    // engine, or AccumulateGrad and GraphRoot in traces whose recorder did not name them; those
    // save nothing): there is nothing to check.
    if (exec.node != 0) ++state_.unknown_node_execs;
  } else {
    if (pass_root_ == IdIndex::kAbsent) pass_root_ = slot;
    state_.nodes[slot].last_pass = pass_index_;
    pass_executed_.push_back(slot);
    CheckNode(slot, exec.start_seq, /*simulated=*/false, exec_op, exec.threw);
    silent_.Unwatch(slot);
  }
  if (exec.threw) {
    pass_threw_ = true;
    pass_stop_seq_ = exec.record_seq;
    state_.threw_execs.insert(exec_op);
  }
}

// autograd's SavedVariable::unpack check for every saved tensor of the node, at record `seq`.
void BackwardReplay::CheckNode(uint32_t node_slot, uint64_t seq, bool simulated, ObjectId exec_op,
                               bool threw, uint32_t recomputing) {
  const NodeState& node = state_.nodes[node_slot];
  for (uint32_t i = 0; i < node.saved_count; ++i) {
    uint32_t saved_slot = node.saved_begin + i;
    SavedState& s = state_.saved[saved_slot];
    Finding base;
    base.node = node_slot;
    base.saved = saved_slot;
    base.simulated = simulated;
    base.recomputing = recomputing;
    base.pass = pass_index_;
    base.exec_op = exec_op;
    base.exec_threw = threw;
    if (s.saved.recompute_from != 0) {
      CheckRecomputeInputs(s.saved.recompute_from, node_slot, seq, simulated, exec_op, threw);
      if (!simulated) CheckRecomputed(node_slot, s, base, seq);
      continue;
    }
    const bool unchecked = IsUncheckedButKnown(s.saved);
    if (!IsVersionChecked(s.saved) && !unchecked) continue;
    const size_t findings_before = state_.findings.size();
    base.current_version = s.saved.saved_version;
    if (const TensorState* t = state_.FindTensor(s.saved.tensor)) {
      base.use_known = true;
      base.use_grad_fn = t->is_leaf ? 0 : t->grad_fn;
      base.use_output_nr = t->output_nr;
    }
    CheckVersion(s, base, seq);
    if (unchecked) {
      // No check at unpack: the counter moving is PyTorch's silence, not its error.
      for (size_t k = findings_before; k < state_.findings.size(); ++k) {
        state_.findings[k].kind = ViolationKind::kSilent;
        state_.findings[k].unchecked = true;
        state_.findings[k].exec_threw = false;
      }
    }
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
                                          bool simulated, ObjectId exec_op, bool threw) {
  uint32_t inputs_slot = state_.index.Find(inputs_node, IdKind::kNode);
  if (inputs_slot == IdIndex::kAbsent || inputs_slot == node_slot) return;
  if (std::find(pass_recomputed_.begin(), pass_recomputed_.end(), inputs_slot) !=
      pass_recomputed_.end()) {
    return;
  }
  pass_recomputed_.push_back(inputs_slot);
  if (!simulated) ClaimRecomputation(inputs_node, exec_op);
  CheckNode(inputs_slot, seq, simulated, exec_op, threw, node_slot);
}

void BackwardReplay::ClaimRecomputation(ObjectId inputs_node, ObjectId exec_op) {
  std::unordered_map<format::InternId, uint32_t> ranks;
  std::vector<uint32_t> keep;
  for (uint32_t slot : packed_nodes_) {
    const NodeState& node = state_.nodes[slot];
    if (node.created_by != 0 && state_.IsDescendant(node.created_by, exec_op)) {
      const uint32_t rank = ranks[node.name]++;
      for (uint32_t i = 0; i < node.saved_count; ++i) {
        const format::SavedTensor& saved = state_.saved[node.saved_begin + i].saved;
        if (saved.hook != format::SavedHook::kPackedTensor) continue;
        recomputed_[RecomputeKey(inputs_node, node.name, rank, saved)] = node.saved_begin + i;
      }
    } else if (node.created_by == 0 || state_.FindOp(node.created_by) == nullptr) {
      keep.push_back(slot);  // Its op is still running: maybe a recomputation not checked yet.
    }
  }
  packed_nodes_ = std::move(keep);
}

void BackwardReplay::CheckRecomputed(uint32_t node_slot, const SavedState& s, const Finding& base,
                                     uint64_t seq) {
  const NodeState& node = state_.nodes[node_slot];
  auto it = recomputed_.find(
      RecomputeKey(s.saved.recompute_from, node.name, node.checkpoint_occurrence, s.saved));
  if (it == recomputed_.end()) return;
  // A tensor the forward had too (a parameter, a view of one), whose counter predates the
  // recomputation: a write in between (an optimizer step) makes the recomputation differ from
  // the forward, so the baseline is its version in forward. Tensors new in the recomputation are
  // compared with their version when it saved them.
  SavedState recomputed = state_.saved[it->second];
  Finding f = base;
  const CounterState* counter = state_.FindCounter(recomputed.saved.version_counter);
  if (counter != nullptr && counter->first_seq < seq) {
    recomputed.saved.saved_version = s.saved.saved_version;
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
  for (size_t k = findings_before; k < state_.findings.size(); ++k) {
    state_.findings[k].kind = ViolationKind::kSilent;
    state_.findings[k].unchecked = true;
    state_.findings[k].exec_threw = false;
  }
}

// The version check proper: the saved tensor's counter moved between the save and record `seq`.
void BackwardReplay::CheckVersion(const SavedState& s, const Finding& base, uint64_t seq) {
  const CounterState* counter = state_.FindCounter(s.saved.version_counter);
  if (counter == nullptr) return;
  uint32_t current = VersionAt(*counter, seq, s.saved.saved_version);
  if (current == s.saved.saved_version) return;
  Finding f = base;
  f.kind = ViolationKind::kVersion;
  f.current_version = current;
  const Bump* last = nullptr;
  for (const Bump& b : counter->bumps) {
    if (b.seq >= seq) break;
    if (b.after > s.saved.saved_version) f.writers.push_back(b.op);
    last = &b;
  }
  // A view written through another tensor sharing its counter (its base or another view) keeps a
  // stale grad_fn: PyTorch regenerates it as AsStridedBackward0 when it raises, and names that.
  // (A base written through a view got CopySlices instead, which the trace shows as a changed
  // grad_fn.)
  f.view_regenerated = f.use_known && f.use_grad_fn != 0 && s.meta_known &&
                       f.use_grad_fn == s.grad_fn && last != nullptr && last->tensor != 0 &&
                       last->tensor != s.saved.tensor;
  state_.findings.push_back(std::move(f));
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

// Closes the open pass. When it threw, runs the rest of it as autograd would have: the nodes
// reachable from its root, each once all its consumers in that graph ran, highest sequence_nr
// first (AccumulateGrad first of all), each checked as of the moment the pass stopped.
void BackwardReplay::EndPass() {
  if (pass_open_ && pass_threw_ && pass_root_ != IdIndex::kAbsent) SimulateRest();
  pass_open_ = false;
  pass_threw_ = false;
  forward_seen_ = false;
  pass_root_ = IdIndex::kAbsent;
  pass_executed_.clear();
  pass_threads_.clear();
  pass_recomputed_.clear();
  recomputed_.clear();
  candidates_.clear();
}

void BackwardReplay::SimulateRest() {
  const std::vector<NodeState>& nodes = state_.nodes;
  const IdIndex& index = state_.index;
  std::unordered_map<uint32_t, uint32_t> local;  // Node slot -> index in graph.
  std::vector<uint32_t> graph{pass_root_};
  local.emplace(pass_root_, 0);
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

}  // namespace torchrr::replayer
