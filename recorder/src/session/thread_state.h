// What the recorder keeps per thread: the ops running on it, the frames that carry an op from its
// start callback to its end callback, and the scratch the callbacks reuse op after op.
//
// RecordFunction's callbacks run on every thread that dispatches an op. Everything here belongs
// to one thread and is touched only by it (an op whose end runs on another thread hands its frame
// over with its handle), so none of it takes a lock. The state is made on a thread's first op and
// deleted when the thread exits.
#ifndef TORCHRR_RECORDER_THREAD_STATE_H_
#define TORCHRR_RECORDER_THREAD_STATE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/flat_hash_map.h>

#include "stacks/python_stacks.h"
#include "sink/record_bytes.h"
#include "capture/saved_variables.h"
#include "capture/wrapper_tensors.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

inline constexpr size_t kMaxPythonFrames = 48;

// Resets `record` to a default-constructed one, keeping the capacity of the vector members named.
template <class T, class... Vectors>
void ResetKeepingCapacity(T& record, Vectors T::*... vectors) {
  T fresh;
  ((fresh.*vectors).swap(record.*vectors), ...);
  record = std::move(fresh);
  ((record.*vectors).clear(), ...);
}

// Where an input's elements lie, taken at the op's start (the op's boxed arguments are gone by its
// end): FiniteRanges gives an output that is a view into it the input's range unscanned.
struct InputSpan {
  const void* storage = nullptr;  // StorageImpl; nullptr when the input cannot be a view's base.
  int64_t first = 0;              // Storage offset of its first element.
  int64_t numel = 0;              // Its elements, contiguous from `first`.
  caffe2::TypeMeta dtype;
};

// What the start callback keeps for the end callback. Frames are reused, op after op, from a
// per-thread pool (their vectors and buffers keep their capacity): see OpHandle.
struct OpFrame {
  format::OpRecord op;
  // Strong references to the inputs' version counters, parallel to op.inputs: the versions after
  // the op are read from them even if an input died inside the op.
  std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> input_counters;
  EncodedRecords before;  // Definitions and TensorInfos to write before the op.
  std::vector<InputSpan> input_spans;  // check_finite: parallel to op.inputs, or empty.
  // The int lists of earlier ops' values (kIntList, kBoolList), for this op's: a shape or a dim
  // list argument costs no allocation once the frame has held as many.
  std::vector<std::vector<int64_t>> spare_ints;
  int uncaught_at_start = 0;
  uint64_t sequence_at_start = 0;  // at::sequence_number::peek() at start and end: nodes created
  uint64_t sequence_at_end = 0;    // by this op have numbers in [start, end) on this thread.
  uint64_t thread = 0;
  // A backward function: the node autograd's engine is running (its id and address, taken at the
  // start).
  format::ObjectId exec_node = 0;
  const void* exec_node_address = nullptr;
  // What its unpack hooks returned that differs from what the node saved (TakeUnpackedTensors).
  std::vector<format::UnpackedTensor> unpacked;
  // The session that started the op (Session::serial()): only that one ends it. An op running
  // across a fork ends in the child, whose session never saw it start.
  uint64_t session = 0;
  bool active = false;
  bool transparent = false;  // A record_function range or an engine wrapper (transparent_scopes).
  // An engine wrapper not recorded unless an op other than its node's backward function runs in
  // it (a hook's, the engine's gradient accumulation): ThreadState::deferred_wrappers. Its id is 0
  // until then. `name` is the RecordFunction's, valid until the wrapper ends.
  bool deferred = false;
  const char* deferred_name = nullptr;
  // Recorded only because of all_ops: an op a kernel runs below autograd, which writes memory
  // no version counter follows until the kernel ends (its value ranges are left out).
  bool folded = false;

  // Back to a fresh frame's state, keeping the capacity of what it holds.
  void Reset();
};

// The NodeRecords an op's end creates, kept (and reused, with their vectors' capacity) until the
// group is written: the end fills in which output a saved output is after creating them.
struct NodeScratch {
  std::vector<format::NodeRecord> records;
  size_t size = 0;

  format::NodeRecord& Next() {
    if (size == records.size()) {
      ++size;
      return records.emplace_back();
    }
    format::NodeRecord& r = records[size++];
    ResetKeepingCapacity(r, &format::NodeRecord::edges, &format::NodeRecord::saved);
    return r;
  }
  format::NodeRecord* begin() { return records.data(); }
  format::NodeRecord* end() { return records.data() + size; }
};

// verify_saved: a saved tensor to fingerprint once the session's lock is released.
struct PendingFingerprint {
  format::FingerprintRecord record;  // All but the hash, the byte range and the time.
  at::Tensor data;
};

using SavedHooks = std::vector<std::pair<const torch::autograd::SavedVariable*, SavedHookFacts>>;

// The tensors Python nodes keep unchecked (ReadUncheckedTensors), by node, read before the
// session's lock.
using UncheckedSaves =
    std::vector<std::pair<const torch::autograd::Node*, std::vector<UncheckedTensor>>>;

// One of an op's output tensors, with where it came from and its ids.
struct OpOutput {
  // Borrowed from the RecordFunction's outputs (no reference count traffic); owned for the
  // elements of a tensor list, which the list hands out by value.
  c10::MaybeOwned<at::Tensor> tensor;
  uint16_t position = 0;
  uint16_t list_index = format::TensorUse::kNotInList;
  format::ObjectId storage = 0;
  format::ObjectId version_counter = 0;
};

struct ThreadState {
  std::vector<format::ObjectId> op_stack;  // Ids of the ops running on this thread, innermost last.
  std::vector<format::OpScope> op_scopes;  // Their scopes, parallel to op_stack.
  // Parallel to op_stack: whether the op runs a Python autograd.Function's forward or backward,
  // code the program wrote, whose ops get stacks of their own (OnStart's `wants_stack`).
  std::vector<bool> runs_function_code;
  int backward_depth = 0;                  // Backward functions running on this thread.
  // The sequence number when the outermost op running on this thread started: a node numbered
  // from there on is an enclosing op's, maybe still being built (a saved-tensor pack hook runs
  // ops from inside the node's construction).
  uint64_t outermost_sequence_at_start = 0;
  // record_function() ranges and engine wrappers among op_stack: the ops directly inside them
  // are the user's (OnStart's `outermost`).
  size_t transparent_scopes = 0;
  // The frames of the deferred engine wrappers running on this thread (OpFrame::deferred),
  // innermost last; each is on op_stack with id 0 until an op inside it records it.
  std::vector<OpFrame*> deferred_wrappers;
  // Takes `frame` off deferred_wrappers when it is the innermost there: at its end, or when its
  // handle is deleted without an end the recorder saw (the recording stopped in between).
  void EndDeferredWrapper(const OpFrame* frame) {
    if (!deferred_wrappers.empty() && deferred_wrappers.back() == frame) {
      deferred_wrappers.pop_back();
    }
  }
  bool busy = false;  // Inside torchrr's own code: ignore ops it dispatches.
  // The nn.Module whose forward runs on this thread (torchrr_set_module; OpRecord.module_path's text)
  // and the serial of the session recording when it was set; empty when none.
  std::string module;
  uint64_t module_session = 0;
  // Forgets the ops running on this thread (their frames, owned by torch, end unrecorded): in a
  // forked child, whose recording starts afresh.
  void ForgetRunningOps() {
    op_stack.clear();
    op_scopes.clear();
    runs_function_code.clear();
    backward_depth = 0;
    transparent_scopes = 0;
    deferred_wrappers.clear();
  }
  // Frames of ended ops, for the next ones (OpHandle).
  std::vector<std::unique_ptr<OpFrame>> free_frames;
  // OnEnd's working storage, kept between ops so that its capacity is reused: an op's end would
  // otherwise allocate and free each of them (OnEnd does not nest: torchrr's own ops are ignored).
  // Empty between ops.
  EncodedRecords group;
  EncodedRecords after;
  NodeScratch nodes;
  std::vector<OpOutput> outputs;  // An op's output tensors, in order.
  // What the op's wrapper-subclass inputs (OnStart) or outputs (RecordEnd) wrap, read before the
  // session's lock is taken (reading them takes the GIL).
  WrapperInners wrapper_inners;
  // What RecordInputs and RecordOutputs look wrappers up in: nullptr when none was read, as for
  // nearly every op.
  const WrapperInners* inners() const { return wrapper_inners.empty() ? nullptr : &wrapper_inners; }
  // What the saved-tensor hooks of the nodes an op created packed, read before the session's lock
  // is taken (reading them takes the GIL), by SavedVariable.
  SavedHooks saved_hooks;
  // OnStart's: what the inputs' Python nodes keep unchecked, and the latest nodes read (address
  // and sequence number, a ring), not read again while their outputs are used.
  UncheckedSaves unchecked_saves;
  // RecordEnd's: the node of the Python Function whose apply ended (TakeFunctionNode).
  compat::NodePtr function_node;
  // ... and where backward uses what that node saved, for a torch.compile region (ReadSavedUses).
  std::shared_ptr<const SavedUses> saved_uses;
  std::array<std::pair<const void*, uint64_t>, 16> unchecked_read{};
  size_t unchecked_read_next = 0;
  std::array<PythonFrame, kMaxPythonFrames> python_frames;  // OnStart's Python stack.
  // verify_saved: fingerprints queued under the session's lock, computed after it is released.
  std::vector<PendingFingerprint> fingerprints;
  // What an ATen op's schema says (op_filter.cc), by op name pointer (and the text it pointed to
  // then).
  struct SchemaFacts {
    std::string text;
    bool writes = true;          // Writes one of its arguments.
    bool returns_tensor = true;  // One of its returns is (or may hold) a tensor.
  };
  ska::flat_hash_map<const char*, SchemaFacts> schema_facts;
  // The memory of deleted OpHandles, for the next ones (OpHandle::operator delete).
  std::array<void*, 64> free_handles{};
  size_t n_free_handles = 0;

  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  ~ThreadState() {
    for (size_t i = 0; i < n_free_handles; ++i) ::operator delete(free_handles[i]);
  }
};

// The calling thread's state, or nullptr before its first op and while it exits. A pointer,
// trivially initialized (constinit: read without a TLS wrapper call): in a shared library each
// access to a thread_local is a call (__tls_get_addr), and one with a constructor adds a second
// (its initialization check); the callbacks pass the state on instead of reading it again.
extern constinit thread_local ThreadState* t_state;

// The calling thread's state, made if need be; nullptr while the thread exits (or out of memory).
ThreadState* NewThreadState();
inline ThreadState* ThisThread() {
  ThreadState* ts = t_state;
  return ts != nullptr ? ts : NewThreadState();
}

// What torch holds between an op's start and end callbacks: the op's frame, which goes back to the
// pool of the thread that ends the op (the thread that started it, but for ops whose end runs
// asynchronously elsewhere: their frame just moves to that thread's pool).
// The handle itself is one small allocation per op, which torch deletes after the op's end: its
// memory goes to a list of the deleting thread and is reused by that thread's next ops (Make).
struct OpHandle : at::ObserverContext {
  std::unique_ptr<OpFrame> frame;

  static std::unique_ptr<at::ObserverContext> Make(ThreadState& ts, std::unique_ptr<OpFrame> f) {
    using Owned = std::unique_ptr<at::ObserverContext>;
    if (ts.n_free_handles == 0) return Owned(new OpHandle(std::move(f)));
    void* memory = ts.free_handles[--ts.n_free_handles];
    return Owned(new (memory) OpHandle(std::move(f)));
  }
  static void operator delete(void* memory) {
    ThreadState* ts = t_state;
    if (ts != nullptr && ts->n_free_handles < ts->free_handles.size()) {
      ts->free_handles[ts->n_free_handles++] = memory;
    } else {
      ::operator delete(memory);
    }
  }

  explicit OpHandle(std::unique_ptr<OpFrame> f) : frame(std::move(f)) {}
  ~OpHandle() override;
};

// A frame from the thread's pool (reset), or a new one.
inline std::unique_ptr<OpFrame> TakeFrame(ThreadState& ts) {
  if (ts.free_frames.empty()) return std::make_unique<OpFrame>();
  std::unique_ptr<OpFrame> frame = std::move(ts.free_frames.back());
  ts.free_frames.pop_back();
  frame->Reset();
  return frame;
}

// Marks the thread as inside torchrr's own code for its lifetime: ops torchrr dispatches (a
// fingerprint's, a symbolizer's) are not recorded.
struct BusyGuard {
  explicit BusyGuard(ThreadState& state) : state(state) { state.busy = true; }
  ~BusyGuard() { state.busy = false; }
  ThreadState& state;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_THREAD_STATE_H_
