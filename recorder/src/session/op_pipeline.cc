// The session's op pipeline: what OnStart and OnEnd do with each recorded op, from its stack to
// the records its end writes.
#include <algorithm>
#include <cstring>
#include <string_view>
#include <exception>
#include <vector>

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>

#include "capture/op_arguments.h"
#include "capture/op_filter.h"
#include "capture/saved_variables.h"
#include "internals/torch_internals.h"
#include "session/session.h"
#include "stacks/native_stacks.h"
#include "stacks/python_stacks.h"

namespace torchrr::recorder {

using format::ObjectId;

namespace {

// Whether the ops directly inside this one run a Python autograd.Function's own code: its apply()
// (THPFunction_apply's RecordFunction: numbered, named by the class, so with no "ns::"), or the
// engine running its node (a PyNode) in backward. A C++ backward formula's ops stay folded under
// it, and so do torch.compile's Functions (CompiledFunction, CompiledFunctionBackward), whose
// graphs' ops are named through the region that runs them.
bool RunsFunctionCode(const at::RecordFunction& fn, const format::OpRecord& op,
                      const void* exec_node) {
  // Most ops are neither (ATen ops without a number, C++ formulas): decided before any name.
  const bool backward = op.scope == format::OpScope::kBackwardFunction;
  if (backward ? exec_node == nullptr
               : op.scope != format::OpScope::kFunction || op.sequence_nr < 0) {
    return false;
  }
  static constexpr std::string_view kCompiled = "CompiledFunction";
  if (std::strncmp(fn.name(), kCompiled.data(), kCompiled.size()) == 0) return false;
  return backward ? IsPythonNode(typeid(*static_cast<const torch::autograd::Node*>(exec_node)))
                  : std::strstr(fn.name(), "::") == nullptr;
}

}  // namespace

format::ObjectId Session::RecordDeferredWrapper(ThreadState& ts, EncodedRecords& out) {
  // Every deferred wrapper on the stack not yet recorded, outermost first (a backward run inside
  // a hook nests one in another): each is an op 0 on the stack, in the order of deferred_wrappers.
  ObjectId parent = 0;
  size_t next = 0;
  for (ObjectId& id : ts.op_stack) {
    if (id == 0) {
      while (next < ts.deferred_wrappers.size() && ts.deferred_wrappers[next]->op.op != 0) ++next;
      if (next == ts.deferred_wrappers.size()) return 0;  // Not a deferred wrapper's: unknown.
      OpFrame& wrapper = *ts.deferred_wrappers[next++];
      wrapper.op.op = ids_.NewId();
      wrapper.op.name = interner_->String(wrapper.deferred_name, out);
      wrapper.op.parent = parent;
      id = wrapper.op.op;
    }
    parent = id;
  }
  return parent;
}


// The stack an op gets, captured before mu_ is taken.
struct Session::CapturedStack {
  uintptr_t pcs[kMaxNativeFrames];
  size_t n_pcs = 0;
  size_t n_py = 0;  // In ThreadState::python_frames (not cleared per op: n_py says how many).
  std::vector<PythonCode> new_codes;
};

bool Session::BeginOp(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame) {
  format::OpRecord& op = frame.op;
  op.start_ns = NowNs();
  frame.uncaught_at_start = std::uncaught_exceptions();
  frame.sequence_at_start = at::sequence_number::peek();
  if (ts.op_stack.empty()) ts.outermost_sequence_at_start = frame.sequence_at_start;
  frame.thread = at::RecordFunction::currentThreadId();
  op.thread = static_cast<uint32_t>(fn.threadId());
  op.scope = ScopeOf(fn.scope());
  op.sequence_nr = fn.seqNr();
  op.forward_thread = fn.forwardThreadId();
  op.grad_mode = at::GradMode::is_enabled();
  op.parent = ts.op_stack.empty() ? 0 : ts.op_stack.back();
  // Stacks for top-level ops outside backward: nested ops share their top-level op's stack,
  // and ops run by autograd's engine have no user frames. An op inside record_function() ranges
  // only (torch.optim's step, a user's profiler range) is one the user called: it gets a stack
  // too. So is an op directly inside the engine's wrapper around a node (a tensor or node hook's),
  // while the wrapper, autograd's own, has none. And one directly inside a torch.compile'd
  // region being run ("Torch-Compiled Region: 0/0", a range around the compiled frame, which
  // has the user's line that called it): the compiled graph's ops, whose frames in the graph's
  // generated code name the user's lines they were traced from, and the ops of another region's
  // compilation after a graph break, run on the graph's nodes with their lines too.
  const bool is_backward = op.scope == format::OpScope::kBackwardFunction;
  const bool outermost = ts.op_stack.size() == ts.transparent_scopes;
  const bool engine_wrapper = outermost && IsEngineWrapper(fn, op.scope, op.sequence_nr);
  frame.transparent = op.scope == format::OpScope::kUserScope || engine_wrapper ||
                      (outermost && IsCompiledRegion(fn.name()));
  // An engine wrapper around only its node's backward function says nothing that function's
  // record does not: it is recorded when another op runs in it (RecordDeferredWrapper).
  if (engine_wrapper && !records_all_ops()) Defer(fn, ts, frame);
  // Directly inside a backward function with grad mode on: the user's forward code run again by
  // activation checkpointing's recomputation (or a create_graph formula): its lines are the
  // user's.
  const bool recomputed = !is_backward && op.grad_mode && ts.backward_depth > 0 &&
                          !ts.op_scopes.empty() &&
                          ts.op_scopes.back() == format::OpScope::kBackwardFunction;
  // Directly inside a Python autograd.Function's forward or backward: the Function's own code
  // (a fused kernel's, a 4-bit matmul's), whose writes are named at their lines, not at apply()'s
  // or backward()'s.
  const bool in_function_code = !is_backward && !ts.runs_function_code.empty() &&
                                ts.runs_function_code.back();
  return (outermost && !is_backward && !engine_wrapper) || recomputed || in_function_code;
}

void Session::Defer(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame) {
  frame.deferred = true;
  frame.deferred_name = fn.name();
  ts.deferred_wrappers.push_back(&frame);
  ts.op_stack.push_back(0);
  ts.op_scopes.push_back(frame.op.scope);
  ts.runs_function_code.push_back(false);
  ++ts.transparent_scopes;
  frame.active = true;
}

void Session::CaptureStack(ThreadState& ts, bool wants_stack, CapturedStack& stack) {
  if (!wants_stack) return;
  if (options_.native_stacks && ts.backward_depth == 0) {
    stack.n_pcs = CaptureNativeStack(stack.pcs, kMaxNativeFrames, 3);
  }
  if (options_.python_stacks) {  // No lock held.
    stack.n_py = CapturePythonStack(ts.python_frames.data(), kMaxPythonFrames, &stack.new_codes);
  }
}

void Session::StartLocked(const at::RecordFunction& fn, ThreadState& ts, OpFrame& frame,
                          CapturedStack& stack) {
  format::OpRecord& op = frame.op;
  const bool is_backward = op.scope == format::OpScope::kBackwardFunction;
  interner_->AddPythonCodes(stack.new_codes);
  if (!is_backward && op.parent == 0 && !ts.op_stack.empty() && ts.op_stack.back() == 0) {
    op.parent = RecordDeferredWrapper(ts, frame.before);
  }
  op.op = ids_.NewId();
  if (op.scope == format::OpScope::kFunction) {
    // An ATen op's name and overload point into its registered schema: stable pointers.
    op.name = interner_->OpName(fn.name(), frame.before);
    op.overload = interner_->OpName(fn.overload_name(), frame.before);
  } else {
    // OnEnd's node scratch is free between ops.
    if (is_backward) {
      frame.exec_node = graph_->ExecutingNode(fn, &op.name, ts.nodes, frame.before,
                                              &frame.exec_node_address);
    }
    // Node names and user scopes are strings the RecordFunction owns: intern by content (a
    // backward function the engine runs has its node's, found above).
    if (op.name == 0) op.name = interner_->String(fn.name(), frame.before);
  }
  op.stack = interner_->Stack(stack.pcs, stack.n_pcs, ts.python_frames.data(), stack.n_py,
                              frame.before);
  // A module set while another recording ran would be named by that recording's ids.
  if (!is_backward && !ts.module.empty() && ts.module_session == serial_) {
    op.module_path = interner_->String(ts.module, frame.before);
  }
  // Before the node's apply() unpacks (and maybe releases) what it saved.
  if (is_backward && fingerprints_.enabled()) {
    graph_->FingerprintAtUse(op.forward_thread, op.sequence_nr, frame.before);
  }
  const c10::ArrayRef<const c10::IValue> inputs = InputsOf(fn);
  // Inside ranges only (record_function, a compiled region), no node is being built around it.
  const uint64_t building_from =
      ts.op_stack.size() > ts.transparent_scopes ? ts.outermost_sequence_at_start : UINT64_MAX;
  graph_->RefInputNodes(inputs, frame.thread, building_from, ts.unchecked_saves, ts.nodes,
                        frame.before);
  RecordInputs(inputs, frame, ids_, *interner_, ts.inners());
  // The definitions and the inputs' metadata go out now, before the records of the ops nested
  // in this one (which end, and are written, first) can name them or describe those inputs
  // as they changed.
  if (!frame.before.empty()) PushGroupLocked(frame.before);
  ts.op_stack.push_back(op.op);
  ts.op_scopes.push_back(op.scope);
  ts.runs_function_code.push_back(RunsFunctionCode(fn, op, frame.exec_node_address));
  if (frame.transparent) ++ts.transparent_scopes;
  if (is_backward) ++ts.backward_depth;
  frame.active = true;
}

std::unique_ptr<at::ObserverContext> Session::OnStart(const at::RecordFunction& fn,
                                                      ThreadState& ts, bool folded) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(ts);
  std::unique_ptr<OpFrame> frame;
  try {
    frame = TakeFrame(ts);
    frame->session = serial_;
    frame->folded = folded;
    const bool wants_stack = BeginOp(fn, ts, *frame);
    if (frame->deferred) {
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      return OpHandle::Make(ts, std::move(frame));
    }
    CapturedStack stack;
    CaptureStack(ts, wants_stack, stack);
    ReadInputsUnchecked(InputsOf(fn), ts);  // Takes the GIL: before mu_.
    ReadWrapperInners(InputsOf(fn), ts.wrapper_inners);  // Likewise.
    {
      std::lock_guard<std::mutex> lock(mu_);
      StartLocked(fn, ts, *frame, stack);
    }
    ts.unchecked_saves.clear();  // Outside mu_: the tensors may be Python's last references.
    ts.wrapper_inners.clear();
    // Outside mu_: reading bytes blocks no other thread.
    if (finite_ranges_.enabled() && !frame->folded) {
      finite_ranges_.NoteOpStart(frame->op);
      finite_ranges_.ScanInputs(InputsOf(fn), frame->op, frame->input_spans);
    }
  } catch (const std::exception& e) {
    Degrade(std::string("internal error at the start of ") + fn.name() + ": " + e.what(), ts);
    frame.reset();
    ts.fingerprints.clear();
    ts.unchecked_saves.clear();
    ts.wrapper_inners.clear();
  }
  // Outside mu_: hashing saved bytes (on CUDA, a kernel and a wait) blocks no other thread.
  if (frame && !ts.fingerprints.empty()) {
    fingerprints_.Take(ts, cuda_tracer(), frame->before);
  }
  // Last: CUDA work launched from here on is this op's.
  if (frame) {
    if (cuda_pending_.load(std::memory_order_relaxed)) MaybeStartCudaTracer(InputsOf(fn));
    if (CudaActivityTracer* cuda = cuda_tracer()) cuda->PushOp(frame->op.op);
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (!frame) return nullptr;
  return OpHandle::Make(ts, std::move(frame));
}

bool Session::EndOnThread(OpFrame& frame, ThreadState& ts) {
  if (CudaActivityTracer* cuda = cuda_tracer(); cuda && !frame.deferred) {
    cuda->PopOp();  // A deferred wrapper pushed none; one begun before CUPTI started, neither.
  }
  const format::OpRecord& op = frame.op;
  if (!ts.op_stack.empty() && ts.op_stack.back() == op.op) {
    ts.op_stack.pop_back();
    ts.op_scopes.pop_back();
    ts.runs_function_code.pop_back();
    if (frame.transparent && ts.transparent_scopes > 0) --ts.transparent_scopes;
  }
  if (op.scope == format::OpScope::kBackwardFunction && ts.backward_depth > 0) {
    --ts.backward_depth;
  }
  frame.active = false;
  if (frame.deferred) {
    ts.EndDeferredWrapper(&frame);
    // Nothing but its node's backward function ran in it: not recorded.
    if (op.op == 0) return false;
  }
  return recording();
}

void Session::EndLocked(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  format::OpRecord& op = frame.op;
  EncodedRecords& after = ts.after;  // Also the definitions the nodes name.
  // The nodes this op created, first, so the outputs' TensorInfo can name them.
  graph_->RefCreatedNodes(ts.outputs, frame, ts.outermost_sequence_at_start, ts.saved_hooks,
                          after, ts.nodes);
  if (ts.function_node) {
    graph_->RefFunctionNode(ts.function_node.get(), frame, ts.saved_hooks, ts.unchecked_saves,
                            ts.saved_uses.get(), after, ts.nodes);
  }
  RecordOutputs(ts.outputs, frame, ids_, after, ts.inners());
  NameSavedOutputs(ts.nodes, ts.outputs, op.outputs);
  // Order: the fingerprints taken at the start (before), the definitions and the outputs'
  // metadata as the op left them, the nodes it created (whose saved tensors those describe),
  // the op itself, its node's execution. Pushed under mu_: no other thread names what this group
  // defines before the group is in the queue.
  EncodedRecords& group = ts.group;
  group.AddAll(after);
  for (const format::NodeRecord& node : ts.nodes) group.Add(node);
  group.Add(op);
  if (op.scope == format::OpScope::kBackwardFunction) {
    format::NodeExecRecord exec;
    exec.node = graph_->ExecutedNode(frame);
    exec.op = op.op;
    exec.thread = op.thread;
    exec.start_ns = op.start_ns;
    exec.end_ns = op.end_ns;
    exec.threw = op.threw;
    exec.unpacked = std::move(frame.unpacked);
    group.Add(exec);
  }
  PushGroupLocked(group);
  graph_->NoteOpEnded(frame);
}

void Session::RecordEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  format::OpRecord& op = frame.op;
  op.end_ns = NowNs();
  op.threw = std::uncaught_exceptions() > frame.uncaught_at_start;
  frame.sequence_at_end = at::sequence_number::peek();
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    op.inputs[i].version_after = ReadVersionCounter(frame.input_counters[i].get());
  }
  frame.input_counters.clear();
  // Whatever happens below, the scratch is left empty (and the tensors released).
  struct ClearScratch {
    ~ClearScratch() {
      state.group.clear();
      state.after.clear();
      state.nodes.size = 0;
      state.outputs.clear();
      state.saved_hooks.clear();  // Outside mu_: dropping a Python node takes the GIL.
      state.unchecked_saves.clear();
      state.wrapper_inners.clear();
      state.function_node.reset();
      state.saved_uses.reset();
    }
    ThreadState& state;
  } clear_scratch{ts};
  EncodedRecords& group = ts.group;
  group.AddAll(frame.before);
  frame.before.clear();
  if (options_.fail_at_op != 0 &&
      ops_recorded_.load(std::memory_order_relaxed) + 1 == options_.fail_at_op) {
    throw std::runtime_error("fault injected at this op (RecorderOptions::fail_at_op)");
  }
  CollectOutputs(fn.outputs(), ts.outputs);
  // Before mu_: reading bytes blocks no other thread.
  if (!frame.folded) finite_ranges_.ScanOutputs(fn.name(), ts.outputs, frame.input_spans, op);
  ReadSavedHooks(ts.outputs, ts.saved_hooks);  // Takes the GIL: before mu_.
  for (const OpOutput& output : ts.outputs) {
    ReadWrapperInner(*output.tensor, ts.wrapper_inners);  // Likewise.
  }
  // A Python Function's apply: the node made inside it, which no output shows (GIL: before mu_).
  if (op.scope == format::OpScope::kFunction && op.sequence_nr >= 0) {
    compat::NodePtr node = TakeFunctionNode(op.sequence_nr);
    if (node && !op.threw) {
      std::vector<UncheckedTensor> unchecked;
      ReadUncheckedTensors(*node, unchecked);
      if (!unchecked.empty()) ts.unchecked_saves.emplace_back(node.get(), std::move(unchecked));
      ReadNodeSavedHooks(node.get(), ts.saved_hooks);
      ts.saved_uses = ReadSavedUses(*node);
      ts.function_node = std::move(node);
    }
  }
  if (op.scope == format::OpScope::kBackwardFunction && frame.exec_node_address != nullptr) {
    TakeUnpackedTensors(frame.exec_node_address, frame.unpacked);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    EndLocked(fn, frame, ts);
  }
  finite_ranges_.NoteOutputs(op);
  ops_recorded_.fetch_add(1, std::memory_order_relaxed);
  // Outside mu_ (hashing bytes blocks no other thread); after the NodeRecords they name.
  if (!ts.fingerprints.empty()) {
    fingerprints_.Take(ts, cuda_tracer(), group);
    std::lock_guard<std::mutex> lock(mu_);
    if (!group.empty()) PushGroupLocked(group);
  }
  if (cuda_tracer()) MaybeFlushCuda();
}

void Session::OnEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(ts);
  if (EndOnThread(frame, ts)) {
    try {
      RecordEnd(fn, frame, ts);
    } catch (const std::exception& e) {
      Degrade(std::string("internal error at the end of ") + fn.name() + ": " + e.what(), ts);
      ts.fingerprints.clear();
    }
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace torchrr::recorder
