#include "session.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>

#include <ATen/SequenceNumber.h>
#include <ATen/core/function_schema.h>
#include <c10/util/MaybeOwned.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#define XXH_INLINE_ALL  // XXH3 on a few words: inlined.
#include <xxhash.h>

#include "autograd_internals.h"
#include "native_stacks.h"
#include "python_stacks.h"
#include "saved_fingerprints.h"
#include "saved_variables.h"

#ifndef TORCHRR_VERSION
#define TORCHRR_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_VERSION
#define TORCHRR_TORCH_VERSION "unknown"
#endif
#ifndef TORCHRR_TORCH_CUDA_VERSION
#define TORCHRR_TORCH_CUDA_VERSION ""
#endif

namespace torchrr::recorder {

using format::ObjectId;
using format::Record;

// Resets `record` to a default-constructed one, keeping the capacity of the vector members named.
template <class T, class... Vectors>
void ResetKeepingCapacity(T& record, Vectors T::*... vectors) {
  T fresh;
  ((fresh.*vectors).swap(record.*vectors), ...);
  record = std::move(fresh);
  ((record.*vectors).clear(), ...);
}

// What the start callback keeps for the end callback. Frames are reused, op after op, from a
// per-thread pool (their vectors and buffers keep their capacity): see OpHandle.
struct OpFrame {
  format::OpRecord op;
  // Strong references to the inputs' version counters, parallel to op.inputs: the versions after
  // the op are read from them even if an input died inside the op.
  std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> input_counters;
  EncodedRecords before;  // Definitions and TensorInfos to write before the op.
  // The int lists of earlier ops' values (kIntList, kBoolList), for this op's: a shape or a dim
  // list argument costs no allocation once the frame has held as many.
  std::vector<std::vector<int64_t>> spare_ints;
  int uncaught_at_start = 0;
  uint64_t sequence_at_start = 0;  // at::sequence_number::peek() at start and end: nodes created
  uint64_t sequence_at_end = 0;    // by this op have numbers in [start, end) on this thread.
  uint64_t thread = 0;
  // A backward function: the node autograd's engine is running (its id and address, taken at the
  // start).
  ObjectId exec_node = 0;
  const void* exec_node_address = nullptr;
  bool active = false;
  bool transparent = false;  // A record_function range or an engine wrapper (transparent_scopes).
  // An engine wrapper not recorded unless an op other than its node's backward function runs in
  // it (a hook's, the engine's gradient accumulation): ThreadState::deferred_wrappers. Its id is 0
  // until then. `name` is the RecordFunction's, valid until the wrapper ends.
  bool deferred = false;
  const char* deferred_name = nullptr;

  // Back to a fresh frame's state, keeping the capacity of what it holds.
  void Reset() {
    for (format::Value& value : op.values) {
      if (value.ints.capacity() != 0) spare_ints.push_back(std::move(value.ints));
    }
    ResetKeepingCapacity(op, &format::OpRecord::inputs, &format::OpRecord::outputs,
                         &format::OpRecord::values);
    input_counters.clear();
    before.clear();
    uncaught_at_start = 0;
    sequence_at_start = sequence_at_end = thread = 0;
    exec_node = 0;
    exec_node_address = nullptr;
    active = false;
    transparent = false;
    deferred = false;
    deferred_name = nullptr;
  }
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

// verify_saved: a saved tensor to fingerprint once mu_ is released (QueueFingerprint).
struct PendingFingerprint {
  format::FingerprintRecord record;  // All but the hash, the byte range and the time.
  at::Tensor data;
};

struct ThreadState {
  std::vector<ObjectId> op_stack;  // Ids of the ops running on this thread, innermost last.
  std::vector<format::OpScope> op_scopes;  // Their scopes, parallel to op_stack.
  int backward_depth = 0;          // Backward functions running on this thread.
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
  bool busy = false;               // Inside torchrr's own code: ignore ops it dispatches.
  // Frames of ended ops, for the next ones (OpHandle).
  std::vector<std::unique_ptr<OpFrame>> free_frames;
  // OnEnd's working storage, kept between ops so that its capacity is reused: an op's end would
  // otherwise allocate and free each of them (OnEnd does not nest: torchrr's own ops are ignored).
  // Empty between ops.
  EncodedRecords group;
  EncodedRecords after;
  NodeScratch nodes;
  // An op's output tensors, in order, with where each came from and its ids.
  struct Output {
    // Borrowed from the RecordFunction's outputs (no reference count traffic); owned for the
    // elements of a tensor list, which the list hands out by value.
    c10::MaybeOwned<at::Tensor> tensor;
    uint16_t position = 0;
    uint16_t list_index = format::TensorUse::kNotInList;
    ObjectId storage = 0;
    ObjectId version_counter = 0;
  };
  std::vector<Output> outputs;
  std::array<PythonFrame, kMaxPythonFrames> python_frames;  // OnStart's Python stack.
  // verify_saved: fingerprints queued under mu_, computed after it is released.
  std::vector<PendingFingerprint> fingerprints;
  // What an ATen op's schema says (SchemaFactsOf), by op name pointer (and the text it pointed to
  // then).
  struct SchemaFacts {
    std::string text;
    bool writes = true;           // Writes one of its arguments.
    bool returns_tensor = true;   // One of its returns is (or may hold) a tensor.
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
namespace {

std::mutex g_active_mu;
std::shared_ptr<Session> g_active;          // Guarded by g_active_mu.
std::atomic<Session*> g_active_raw{nullptr};  // The callbacks' fast path.


// The calling thread's state, made on its first op and deleted when it exits. A pointer, trivially
// initialized: in a shared library each access to a thread_local is a call (__tls_get_addr), and
// one with a constructor adds a second (its initialization check); the callbacks pass the state
// on instead of reading it again.
thread_local ThreadState* t_state = nullptr;
thread_local bool t_state_gone = false;  // The thread's state was deleted: it is exiting.

struct ThreadStateOwner {
  ~ThreadStateOwner() {
    t_state_gone = true;
    delete std::exchange(t_state, nullptr);
  }
};

[[gnu::noinline]] ThreadState* NewThreadState() {
  if (t_state_gone) return nullptr;
  static thread_local ThreadStateOwner owner;  // Deletes it at the thread's exit.
  (void)owner;
  t_state = new (std::nothrow) ThreadState();
  return t_state;
}

// The calling thread's state, made if need be; nullptr while the thread exits (or out of memory).
ThreadState* ThisThread() {
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
  ~OpHandle() override {
    // 64: deeper than ops nest in practice; a pool never holds more.
    ThreadState* ts = t_state;
    if (ts == nullptr) return;  // The thread is exiting: the frame is freed.
    ts->EndDeferredWrapper(frame.get());
    try {
      if (ts->free_frames.size() < 64) ts->free_frames.push_back(std::move(frame));
    } catch (const std::bad_alloc&) {
      // The frame is freed instead.
    }
  }
};

std::unique_ptr<OpFrame> TakeFrame(ThreadState& ts) {
  if (ts.free_frames.empty()) return std::make_unique<OpFrame>();
  std::unique_ptr<OpFrame> frame = std::move(ts.free_frames.back());
  ts.free_frames.pop_back();
  frame->Reset();
  return frame;
}

// RecordFunction's step_callbacks_ and fn_ are private. The start callback is the one place that
// can say the op's outputs are not wanted (step_callbacks_), and fn_ tells an op named by its schema
// from one named by a string without copying the schema (operator_schema() returns a copy). Both
// are reached through the explicit-instantiation access idiom (access is not checked in an explicit
// instantiation's template arguments). A torch that renames or retypes them fails to compile here
// rather than misbehave.
struct StepCallbacksMember {
  using type = at::StepCallbacks at::RecordFunction::*;
};
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
  friend typename Tag::type MemberOf(Tag) { return Member; }
};
StepCallbacksMember::type MemberOf(StepCallbacksMember);
template struct PrivateMember<StepCallbacksMember, &at::RecordFunction::step_callbacks_>;
struct FnMember {
  using type = std::variant<std::string, std::reference_wrapper<const c10::FunctionSchema>>
      at::RecordFunction::*;
};
FnMember::type MemberOf(FnMember);
template struct PrivateMember<FnMember, &at::RecordFunction::fn_>;

// Whether a type may hold a tensor (Tensor, Tensor?, Tensor[], a tuple of them, Any).
bool MayHoldTensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType || type->kind() == c10::TypeKind::AnyType) {
    return true;
  }
  for (const c10::TypePtr& inner : type->containedTypes()) {
    if (MayHoldTensor(inner)) return true;
  }
  return false;
}

// What an ATen op's schema says: whether the op writes any of its arguments (its alias
// annotations: in-place ops, out= overloads) and whether it returns a tensor. Cached per thread by
// the name pointer, which points into the op's registered schema: looked up once per op. An op
// named by a string (C++'s RECORD_FUNCTION), whose name is a copy that can sit anywhere, has no
// schema: it counts as writing and returning tensors, and is not cached.
const ThreadState::SchemaFacts& SchemaFactsOf(const at::RecordFunction& fn, ThreadState& ts) {
  static const ThreadState::SchemaFacts kUnknown;
  const auto* schema =
      std::get_if<std::reference_wrapper<const c10::FunctionSchema>>(&(fn.*MemberOf(FnMember{})));
  if (schema == nullptr) return kUnknown;
  const char* name = schema->get().name().c_str();
  auto it = ts.schema_facts.find(name);
  if (it != ts.schema_facts.end() && it->second.text == name) return it->second;
  ThreadState::SchemaFacts facts;
  facts.writes = schema->get().is_mutable();
  facts.returns_tensor = false;
  for (const c10::Argument& ret : schema->get().returns()) {
    facts.returns_tensor |= MayHoldTensor(ret.type());
  }
  try {
    ThreadState::SchemaFacts& entry = ts.schema_facts[name];
    entry = std::move(facts);
    entry.text = name;
    return entry;
  } catch (const std::bad_alloc&) {
    return kUnknown;  // Not cached (looked up again next time), and the op is recorded.
  }
}

// An ATen op that creates no autograd node and bumps no version counter, run inside a recorded ATen
// op or backward function, is folded into it (not recorded; SPEC.md, Which ops):
// - ops a kernel runs below autograd: the enclosing kernel (autograd's, or the ADInplaceOrView
//   kernel of an in-place or view op) excluded ADInplaceOrView and the autograd keys. Inference
//   mode and _AutoDispatchBelowAutograd (custom ops' autograd) exclude only the autograd keys:
//   their ops can still bump versions, and are recorded;
// - the ops of a backward formula (inside a backward function, grad mode off: no create_graph)
//   that write none of their arguments. Those that write (a gradient accumulated in place, a hook's
//   or a custom backward's in-place op) are recorded;
// - ops that write none of their arguments and return no tensor (item's _local_scalar_dense): with
//   no tensor out, they create no node either.
bool FoldedIntoTheOpAround(const at::RecordFunction& fn, ThreadState& ts) {
  if (fn.scope() != at::RecordScope::FUNCTION || ts.op_scopes.empty()) return false;
  const format::OpScope around = ts.op_scopes.back();
  if (around != format::OpScope::kFunction && around != format::OpScope::kBackwardFunction) {
    return false;
  }
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) return true;
  const ThreadState::SchemaFacts& facts = SchemaFactsOf(fn, ts);
  if (facts.writes) return false;
  return !facts.returns_tensor || (ts.backward_depth > 0 && !at::GradMode::is_enabled());
}

// An op the recorder does not record: its outputs need not be collected. The dispatcher reads the
// flag after the start callbacks, before it calls the kernel; without it the outputs are not
// boxed into a vector of IValues (an allocation and a reference count per tensor, on every op).
// Only when torchrr's is the op's one callback: another may want them.
std::unique_ptr<at::ObserverContext> Unrecorded(const at::RecordFunction& fn) {
  // The guards the dispatcher and autograd start callbacks on are never const objects.
  at::StepCallbacks& callbacks =
      const_cast<at::RecordFunction&>(fn).*MemberOf(StepCallbacksMember{});
  if (callbacks.callbacks_.size() == 1) callbacks.needs_outputs_ = false;
  return nullptr;
}

std::unique_ptr<at::ObserverContext> StartTrampoline(const at::RecordFunction& fn) {
  Session* session = g_active_raw.load(std::memory_order_acquire);
  if (session == nullptr || !session->recording()) return Unrecorded(fn);
  ThreadState* ts = ThisThread();
  if (ts == nullptr || ts->busy) return Unrecorded(fn);
  if (!session->records_all_ops() && FoldedIntoTheOpAround(fn, *ts)) return Unrecorded(fn);
  return session->OnStart(fn, *ts);
}

void EndTrampoline(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  OpFrame& frame = *static_cast<OpHandle&>(*ctx).frame;
  if (!frame.active) return;
  Session* session = g_active_raw.load(std::memory_order_acquire);
  ThreadState* ts = t_state;
  if (session == nullptr || ts == nullptr || ts->busy) return;
  session->OnEnd(fn, frame, *ts);
}

// The wrapper autograd's engine runs each node in ("autograd::engine::evaluate_function:
// MmBackward0", a C++ RECORD_FUNCTION with no sequence number): around the node's backward
// function and its hooks.
bool IsEngineWrapper(const at::RecordFunction& fn, format::OpScope scope, int64_t sequence_nr) {
  static constexpr std::string_view kPrefix = "autograd::engine::evaluate_function: ";
  return scope == format::OpScope::kFunction && sequence_nr < 0 &&
         std::strncmp(fn.name(), kPrefix.data(), kPrefix.size()) == 0;
}

format::OpScope ScopeOf(at::RecordScope scope) {
  switch (scope) {
    case at::RecordScope::FUNCTION: return format::OpScope::kFunction;
    case at::RecordScope::BACKWARD_FUNCTION: return format::OpScope::kBackwardFunction;
    case at::RecordScope::USER_SCOPE: return format::OpScope::kUserScope;
    default: return format::OpScope::kOther;
  }
}

// The op's inputs. A RecordFunction started without them (some redispatched ops) has none; a torch
// header built without NDEBUG asserts on that instead of returning an empty list.
c10::ArrayRef<const c10::IValue> InputsOf(const at::RecordFunction& fn) {
  try {
    return fn.inputs();
  } catch (const c10::Error&) {
    return {};
  }
}

struct BusyGuard {
  explicit BusyGuard(ThreadState& state) : state(state) { state.busy = true; }
  ~BusyGuard() { state.busy = false; }
  ThreadState& state;
};

std::vector<std::string> ReadCommandLine() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

format::FileInfo MakeFileInfo(const RecorderOptions& options) {
  format::FileInfo info;
  info.torchrr_version = TORCHRR_VERSION;
  info.torch_version = TORCHRR_TORCH_VERSION;
  info.cuda_version = TORCHRR_TORCH_CUDA_VERSION;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.host = host;
  info.pid = getpid();
  info.rank = options.rank >= 0 ? options.rank : EnvInt("RANK", -1);
  info.world_size = EnvInt("WORLD_SIZE", 0);
  info.start_time_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  info.command_line = ReadCommandLine();
  return info;
}

}  // namespace

// Receives CUPTI's records on CUPTI's thread (or the one in Flush/Stop), one buffer at a time,
// never concurrently: interns kernel names and pushes each buffer's records as one group.
class Session::CudaSink : public CudaActivityTracer::Sink {
 public:
  explicit CudaSink(Session* session) : session_(session) {}

  void OnKernel(const format::CudaKernelRecord& record, std::string_view name) override {
    if (record.op == kOwnCudaWork) return;
    format::CudaKernelRecord r = record;
    {
      std::lock_guard<std::mutex> lock(session_->mu_);
      r.name = session_->InternString(name, group_);
    }
    group_.Add(r);
  }
  void OnMemcpy(const format::CudaMemcpyRecord& record) override {
    if (record.op != kOwnCudaWork) group_.Add(record);
  }
  void OnDataLoss(uint64_t records, std::string_view reason) override {
    int64_t now = NowNs();
    group_.Add(format::DataLossRecord{records, 0, now, now, std::string(reason)});
  }
  void OnDeliveryEnd() override {
    if (!group_.empty() && session_->recording()) {
      std::lock_guard<std::mutex> lock(session_->mu_);
      session_->PushGroupLocked(group_);
    }
    group_.clear();
  }

 private:
  Session* session_;
  EncodedRecords group_;  // CUPTI delivery only.
};

Session::Session(const RecorderOptions& options) : options_(options) {}

void Session::StartCudaTracer() {
  if (!options_.cuda_kernels || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ||
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() <= 0) {
    return;  // No CUDA device: nothing to trace, and nothing to warn about.
  }
  CuptiApi api;
  std::string why_not;
  cuda_sink_ = std::make_unique<CudaSink>(this);
  if (LoadCupti(&api, &why_not)) {
    cuda_tracer_ = CudaActivityTracer::Start(api, cuda_sink_.get(), &NowNs, &why_not);
  }
  if (!cuda_tracer_) {
    std::fprintf(stderr, "torchrr: warning: CUDA kernels not recorded: %s\n", why_not.c_str());
  }
}

// CUPTI hands over full buffers on its own; a flush about once a second keeps a crashed run's
// trace close to complete. One thread flushes, outside every lock (delivery takes mu_).
void Session::MaybeFlushCuda() {
  int64_t now = NowNs();
  int64_t last = last_cuda_flush_ns_.load(std::memory_order_relaxed);
  if (now - last < 1'000'000'000) return;
  if (!last_cuda_flush_ns_.compare_exchange_strong(last, now)) return;
  cuda_tracer_->Flush();
}

Session::~Session() { Stop(); }

bool Session::ThreadInsideRecordedOp() {
  const ThreadState* ts = t_state;
  return ts != nullptr && !ts->busy && !ts->op_stack.empty() &&
         g_active_raw.load(std::memory_order_acquire) != nullptr;
}

std::shared_ptr<Session> Session::Active() {
  std::lock_guard<std::mutex> lock(g_active_mu);
  return g_active;
}

std::shared_ptr<Session> Session::Start(const RecorderOptions& options, std::string* error) {
  std::lock_guard<std::mutex> lock(g_active_mu);
  if (g_active) {
    *error = "another torchrr recorder is already recording in this process";
    return nullptr;
  }
  std::shared_ptr<Session> session(new Session(options));
  ForgetPythonCodeDescriptions();  // This session's python_codes_ starts empty.
  TraceSink::Options sink_options;
  sink_options.path = options.path;
  sink_options.max_buffered_bytes = options.max_buffered_bytes;
  sink_options.when_full = options.when_full;
  sink_options.zstd_level = options.zstd_level;
  // The writer thread takes pending groups each time it looks at the queue: the session outlives
  // the sink's thread (Stop closes the sink).
  Session* raw = session.get();
  sink_options.pull = [raw] { raw->PullPending(); };
  // A batch is small beside the queue's bound, so that kWait and kDrop still act per few ops.
  session->pending_bytes_ = std::clamp<size_t>(options.max_buffered_bytes / 16, 1, 64u << 10);
  session->sink_ = TraceSink::Open(sink_options, MakeFileInfo(options), error);
  if (!session->sink_) return nullptr;

  session->verify_saved_.store(options.verify_saved, std::memory_order_relaxed);
  session->StartCudaTracer();
  session->last_cuda_flush_ns_.store(NowNs(), std::memory_order_relaxed);
  session->recording_.store(true, std::memory_order_release);
  g_active = session;
  g_active_raw.store(session.get(), std::memory_order_release);
  session->callback_handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&StartTrampoline, &EndTrampoline)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  return session;
}

void Session::Stop() {
  std::call_once(stop_once_, [this] {
    recording_.store(false, std::memory_order_release);
    if (callback_handle_ != 0) at::removeCallback(callback_handle_);
    // Callbacks that were already running finish before the tables and the sink go away.
    while (in_flight_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    if (cuda_tracer_) {
      // Kernels still running have no end time yet: wait for them, unless this is the terminate
      // handler (a failed device could hang it).
      if (std::uncaught_exceptions() == 0) {
        try {
          const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
          for (c10::DeviceIndex d = 0; d < cuda->deviceCount(); ++d) cuda->synchronizeDevice(d);
        } catch (const std::exception&) {
        }
      }
      cuda_tracer_->Stop();  // Delivers the rest through cuda_sink_, which pushes to sink_.
      cuda_tracer_.reset();
    }
    if (sink_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        FlushPendingLocked(/*may_wait=*/true);
      }
      sink_->Close();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      tensors_.Clear();
      storages_.Clear();
      counters_.Clear();
      nodes_.Clear();
      node_keys_.clear();
    }
    if (callback_handle_ == 0) return;  // Never started (Start() failed, holding g_active_mu).
    std::lock_guard<std::mutex> lock(g_active_mu);
    if (g_active.get() == this) {
      g_active_raw.store(nullptr, std::memory_order_release);
      g_active.reset();  // The caller still holds a reference; this is not the last one.
    }
  });
}

void Session::Degrade(const std::string& why) {
  if (!recording_.exchange(false)) return;
  std::fprintf(stderr,
               "torchrr: warning: recording stopped: %s; the run goes on without recording\n",
               why.c_str());
}

void Session::PushGroupLocked(EncodedRecords& group) {
  pending_.AddAll(group);
  group.clear();
  if (pending_.bytes().size() >= pending_bytes_) FlushPendingLocked(/*may_wait=*/true);
}

void Session::FlushPendingLocked(bool may_wait) {
  if (pending_.empty()) return;
  TraceSink::PushResult result = sink_->Push(pending_, may_wait);
  pending_.clear();
  switch (result) {
    case TraceSink::PushResult::kQueued:
      break;
    case TraceSink::PushResult::kDropped:
      ForgetInterned();
      break;
    case TraceSink::PushResult::kFailed:
      recording_.store(false, std::memory_order_release);  // The sink already warned.
      break;
  }
}

void Session::PullPending() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) FlushPendingLocked(/*may_wait=*/false);
}

void Session::ForgetInterned() {
  strings_.clear();
  op_names_.clear();
  node_type_names_.clear();
  frames_.clear();
  python_frames_.clear();
  stacks_.clear();
  // Tensors keep their ids but their metadata is written again on next use.
  tensors_.ResetExtras();
}

void Session::RecordError(format::ErrorKind kind, const std::string& type,
                          const std::string& message) {
  ThreadState* ts = ThisThread();
  if (!recording() || ts == nullptr) return;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(*ts);
  EncodedRecords group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    format::ErrorRecord error;
    error.kind = kind;
    error.op = ts->op_stack.empty() ? 0 : ts->op_stack.back();
    error.thread = static_cast<uint32_t>(at::RecordFunction::currentThreadId());
    error.time_ns = NowNs();
    error.type = InternString(type, group);
    error.message = message;
    group.Add(error);
    PushGroupLocked(group);
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

format::InternId Session::InternString(std::string_view text, EncodedRecords& out) {
  if (text.empty()) return 0;
  auto it = strings_.find(text);
  if (it != strings_.end()) return it->second;
  format::InternId id = sink_->NextStringId();
  strings_.emplace(text, id);
  out.Add(format::StringDef{id, std::string(text)});
  return id;
}

format::InternId Session::InternOpName(const char* name, EncodedRecords& out) {
  if (name == nullptr || *name == '\0') return 0;
  // The pointer is a shortcut, checked against the text: an ATen op's name points into its
  // registered schema, but a RecordFunction named by a string (C++'s RECORD_FUNCTION, autograd's
  // "autograd::engine::evaluate_function: MulBackward0") hands out its own copy, whose memory the
  // next one reuses for another name.
  auto it = op_names_.find(name);
  if (it != op_names_.end() && it->second.text == name) return it->second.id;
  format::InternId id = InternString(name, out);
  OpName& entry = op_names_[name];
  entry.id = id;
  entry.text = name;
  return id;
}

format::InternId Session::InternNodeName(const torch::autograd::Node& node, EncodedRecords& out,
                                         const std::string** text, bool* accumulate_grad) {
  const std::type_info* type = &typeid(node);
  auto it = node_type_names_.find(type);
  if (it != node_type_names_.end() && !it->second.per_instance) {
    if (text != nullptr) *text = &it->second.text;
    if (accumulate_grad != nullptr) *accumulate_grad = it->second.accumulate_grad;
    return it->second.id;
  }
  node_name_ = node.name();
  const format::InternId id = InternString(node_name_, out);
  if (text != nullptr) *text = &node_name_;
  const bool is_accumulate_grad =
      dynamic_cast<const torch::autograd::AccumulateGrad*>(&node) != nullptr;
  if (accumulate_grad != nullptr) *accumulate_grad = is_accumulate_grad;
  if (it == node_type_names_.end()) {
    NodeTypeName& entry = node_type_names_[type];
    entry.id = id;
    entry.text = node_name_;
    entry.per_instance = IsPythonNode(*type);
    entry.accumulate_grad = is_accumulate_grad;
  }
  return id;
}

format::InternId Session::InternStack(const uintptr_t* pcs, size_t n_pcs,
                                      const PythonFrame* py, size_t n_py,
                                      EncodedRecords& out) {
  if (n_pcs == 0 && n_py == 0) return 0;
  std::string& key = stack_key_;
  key.assign(reinterpret_cast<const char*>(pcs), n_pcs * sizeof(uintptr_t));
  key.append(reinterpret_cast<const char*>(py), n_py * sizeof(PythonFrame));
  auto it = stacks_.find(key);
  if (it != stacks_.end()) return it->second;
  format::StackDef stack;
  stack.id = ++next_stack_id_;
  stack.frames.reserve(n_pcs + n_py);
  // Native frames first (innermost first: the dispatcher, the binding, the interpreter), then the
  // Python frames that called into them, innermost first.
  for (size_t i = 0; i < n_pcs; ++i) {
    auto [frame, created] = frames_.emplace(pcs[i], 0);
    if (created) {
      frame->second = sink_->NextFrameId();
      format::FrameDef def;  // Symbolized by the writer thread before it is written.
      def.id = frame->second;
      def.kind = format::FrameKind::kNative;
      def.pc = pcs[i];
      out.Add(def);
    }
    stack.frames.push_back(frame->second);
  }
  for (size_t i = 0; i < n_py; ++i) {
    uint64_t py_key = (static_cast<uint64_t>(py[i].code) << 32) | static_cast<uint32_t>(py[i].line);
    auto [frame, created] = python_frames_.emplace(py_key, 0);
    if (created) {
      frame->second = sink_->NextFrameId();
      format::FrameDef def;
      def.id = frame->second;
      def.kind = format::FrameKind::kPython;
      def.line = static_cast<uint32_t>(std::max(py[i].line, 0));
      auto code = python_codes_.find(py[i].code);
      if (code != python_codes_.end()) {
        def.file = InternString(code->second.file, out);
        def.function = InternString(code->second.function, out);
        def.framework = code->second.framework;
      }
      out.Add(def);
    }
    stack.frames.push_back(frame->second);
  }
  stacks_.emplace(key, stack.id);
  out.Add(stack);
  return stack.id;
}

format::ObjectId Session::StorageId(const c10::TensorImpl& impl, NodeState* pinned_for) {
  if (!impl.has_storage()) return 0;
  const c10::Storage& storage = impl.unsafe_storage();
  c10::StorageImpl* storage_impl = storage.unsafeGetStorageImpl();
  if (storage_impl == nullptr) return 0;
  if (pinned_for == nullptr) return storages_.Lookup(storage_impl, next_id_);
  const ObjectId id = storages_.LookupPinned(
      storage_impl, [&] { return storage.getWeakStorageImpl(); }, next_id_);
  pinned_for->pinned_storages.push_back({storage_impl, id});
  return id;
}

format::ObjectId Session::VersionCounterId(const c10::TensorImpl& impl) {
  const c10::intrusive_ptr_target* counter = VersionCounterOf(impl);
  if (counter == nullptr) return 0;
  bool created = false;
  return counters_.Lookup(counter, [&] { return WeakVersionCounter(impl); }, next_id_, created)
      .id;
}

format::ObjectId Session::RefTensor(const at::Tensor& tensor, EncodedRecords& out,
                                    ObjectId* storage_id, ObjectId* counter_id) {
  if (!tensor.defined()) return 0;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  bool created = false;
  auto& entry = tensors_.Lookup(
      impl, [&] { return c10::weak_intrusive_ptr<c10::TensorImpl>(tensor.getIntrusivePtr()); },
      next_id_, created);

  // Most uses of a tensor find its metadata unchanged: compare in place, build only on change.
  TensorState& state = entry.extra;
  const void* storage_impl = nullptr;
  if (impl->has_storage()) storage_impl = impl->unsafe_storage().unsafeGetStorageImpl();
  const void* counter_impl = VersionCounterOf(*impl);
  const bool known = !created && state.written;
  const ObjectId storage = known && storage_impl == state.storage_impl &&
                                   state.storage_generation == storages_.Generation()
                               ? state.storage
                               : StorageId(*impl);
  const ObjectId counter = known && counter_impl == state.counter_impl &&
                                   state.counter_generation == counters_.Generation(counter_impl)
                               ? state.version_counter
                               : VersionCounterId(*impl);
  if (storage_id != nullptr) *storage_id = storage;
  if (counter_id != nullptr) *counter_id = counter;
  // The ids are those of the objects the tensor holds now: (re)start caching them, also after a
  // removal. Read after the lookups above: a removal from here on changes them.
  state.storage_impl = storage_impl;
  state.counter_impl = counter_impl;
  state.storage_generation = storages_.Generation();
  state.counter_generation = counters_.Generation(counter_impl);
  const bool strided = impl->layout() == c10::kStrided;
  torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(tensor);
  const uint64_t grad_fn_generation = nodes_.Generation(grad_fn);  // Find removes nothing.
  ObjectId grad_fn_id = 0;
  if (grad_fn != nullptr) {
    grad_fn_id = known && state.grad_fn != 0 && grad_fn == state.grad_fn_node &&
                         state.grad_fn_generation == grad_fn_generation
                     ? state.grad_fn
                     : nodes_.Find(grad_fn);
  }
  state.grad_fn_node = grad_fn;
  state.grad_fn_generation = grad_fn_generation;
  const uint32_t output_nr = impl->autograd_meta() != nullptr ? tensor.output_nr() : 0;
  const c10::Device device = impl->device();
  const auto device_type = static_cast<int8_t>(device.type());
  const int8_t device_index = device.has_index() ? device.index() : -1;
  const auto dtype = static_cast<format::DType>(impl->dtype().toScalarType());
  const uint64_t nbytes = impl->has_storage() ? impl->unsafe_storage().nbytes() : 0;
  // verify_saved: where the bytes are, so that a write through another storage over the same
  // memory (from_blob, DLPack) can be named. Not otherwise: it costs trace bytes.
  const uint64_t data_address =
      verify_saved_.load(std::memory_order_relaxed) && impl->has_storage()
          ? reinterpret_cast<uint64_t>(impl->unsafe_storage().data())
          : 0;
  const bool requires_grad = impl->requires_grad();
  const bool is_leaf = grad_fn == nullptr;
  const int64_t storage_offset = strided ? impl->storage_offset() : 0;
  c10::IntArrayRef sizes = strided ? impl->sizes() : c10::IntArrayRef();
  c10::IntArrayRef strides = strided ? impl->strides() : c10::IntArrayRef();
  // The metadata besides the ids, hashed (sizes and strides as far as kMaxHashedDims go, and
  // their count: a tensor of more dimensions, rare, is written at every use).
  constexpr size_t kMaxHashedDims = 12;
  const bool hashable = sizes.size() <= kMaxHashedDims && strides.size() <= kMaxHashedDims;
  uint64_t metadata_hash = 0;
  if (hashable) {
    std::array<int64_t, 6 + 2 * kMaxHashedDims> words;
    size_t n = 0;
    words[n++] = static_cast<int64_t>(output_nr) | (int64_t{static_cast<uint8_t>(dtype)} << 32) |
                 (int64_t{static_cast<uint8_t>(device_type)} << 40) |
                 (int64_t{static_cast<uint8_t>(device_index)} << 48) |
                 (int64_t{requires_grad} << 56) | (int64_t{is_leaf} << 57) |
                 (int64_t{strided} << 58);
    words[n++] = static_cast<int64_t>(nbytes);
    words[n++] = static_cast<int64_t>(data_address);
    words[n++] = storage_offset;
    words[n++] = static_cast<int64_t>(sizes.size() | (strides.size() << 16));
    for (int64_t v : sizes) words[n++] = v;
    for (int64_t v : strides) words[n++] = v;
    metadata_hash = XXH3_64bits(words.data(), n * sizeof(int64_t));
  }
  if (known && hashable && state.storage == storage && state.version_counter == counter &&
      state.grad_fn == grad_fn_id && state.metadata_hash == metadata_hash) {
    return entry.id;
  }
  state.written = true;
  state.storage = storage;
  state.version_counter = counter;
  state.grad_fn = grad_fn_id;
  state.metadata_hash = metadata_hash;

  format::TensorInfo& info = tensor_info_;  // Its vectors keep their capacity.
  info.tensor = entry.id;
  info.storage = storage;
  info.version_counter = counter;
  info.dtype = dtype;
  info.device.type = device_type;
  info.device.index = device_index;
  info.shape.assign(sizes.begin(), sizes.end());
  info.strides.assign(strides.begin(), strides.end());
  info.storage_offset = storage_offset;
  info.requires_grad = requires_grad;
  info.is_leaf = is_leaf;
  info.grad_fn = grad_fn_id;
  info.output_nr = output_nr;
  info.storage_nbytes = nbytes;
  info.storage_address = data_address;
  out.Add(info);
  return entry.id;
}

format::ObjectId Session::RefNode(torch::autograd::Node* node, const OpFrame* creator,
                                  EncodedRecords& defs, NodeScratch& nodes) {
  if (node == nullptr) return 0;
  std::vector<torch::autograd::Node*> pending;
  bool created = false;
  auto& entry = nodes_.Lookup(node, [&] { return node->weak_from_this(); }, next_id_, created);
  ObjectId id = entry.id;
  if (!created) return id;
  WriteNodeRecord(node, id, &entry.extra, creator, pending, defs, nodes);
  // Nodes reached through edges that were never seen as an op's grad_fn (AccumulateGrad of
  // leaves, nodes created before the recording started).
  while (!pending.empty()) {
    torch::autograd::Node* next = pending.back();
    pending.pop_back();
    auto* next_entry = nodes_.FindEntry(next);
    WriteNodeRecord(next, next_entry != nullptr ? next_entry->id : 0,
                    next_entry != nullptr ? &next_entry->extra : nullptr, creator, pending, defs,
                    nodes);
  }
  return id;
}

void Session::WriteNodeRecord(torch::autograd::Node* node, ObjectId id, NodeState* state,
                              const OpFrame* creator, std::vector<torch::autograd::Node*>& pending,
                              EncodedRecords& defs, NodeScratch& nodes) {
  format::NodeRecord& record = nodes.Next();
  record.node = id;
  bool accumulate_grad = false;
  record.name = InternNodeName(*node, defs, nullptr, &accumulate_grad);
  record.forward_thread = node->thread_id();
  uint64_t sequence_nr = node->sequence_nr();
  record.sequence_nr = static_cast<int64_t>(sequence_nr);
  if (creator != nullptr && node->thread_id() == creator->thread &&
      sequence_nr >= creator->sequence_at_start && sequence_nr < creator->sequence_at_end) {
    record.created_by = creator->op.op;
  }
  if (accumulate_grad) {
    auto* accumulate = static_cast<torch::autograd::AccumulateGrad*>(node);
    record.variable = RefTensor(accumulate->variable, defs);
  }

  const bool verify = verify_saved_.load(std::memory_order_relaxed);
  record.saved_kind = VisitSavedVariables(
      *node, [&](const char* name, uint32_t list_index, const torch::autograd::SavedVariable& sv) {
        SavedVariableFacts facts = ReadSavedVariable(sv);
        format::SavedTensor saved;
        saved.name = InternOpName(name, defs);  // The generated table's literals: stable.
        saved.list_index = list_index;
        saved.defined = facts.defined;
        saved.has_hooks = facts.has_hooks;
        saved.is_output = facts.is_output;
        saved.is_leaf = facts.is_leaf;
        saved.saved_version = facts.saved_version;
        saved.output_nr = facts.output_nr;
        if (facts.data != nullptr) {
          // A saved output is a shallow copy sharing the output's storage and counter; OnEnd
          // names the output the program holds instead.
          if (facts.saved_original) {
            saved.tensor = RefTensor(*facts.data, defs, nullptr, &saved.version_counter);
          } else {
            saved.version_counter = VersionCounterId(*facts.data->unsafeGetTensorImpl());
          }
          // The same id RefTensor gave (the storage lives), pinned until the node runs.
          saved.storage = StorageId(*facts.data->unsafeGetTensorImpl(), state);
          if (verify) {
            QueueFingerprint(id, saved.name, list_index, *facts.data, saved.tensor,
                             format::FingerprintWhen::kAtSave);
          }
        }
        record.saved.push_back(saved);
      });
  if (record.saved_kind == format::SavedSetKind::kUnknown) {
    std::string type = typeid(*node).name();
    if (type.find("CppNode") != std::string::npos || type.find("PyNode") != std::string::npos) {
      record.saved_kind = format::SavedSetKind::kCustom;
    }
  }

  if (record.created_by == 0 && sequence_nr != UINT64_MAX) {
    record.created_by = CreatorOf(node->thread_id(), sequence_nr,
                                  record.saved_kind == format::SavedSetKind::kCustom);
  }

  // The edges' lookups below may move nodes_' entries: `state` is not used after them.
  const auto& edges = node->next_edges();
  record.edges.reserve(edges.size());
  for (const auto& edge : edges) {
    format::Edge out_edge;
    out_edge.input_nr = edge.input_nr;
    if (edge.function) {
      bool created = false;
      torch::autograd::Node* next = edge.function.get();
      out_edge.node =
          nodes_.Lookup(next, [&] { return next->weak_from_this(); }, next_id_, created).id;
      if (created) pending.push_back(next);
    }
    record.edges.push_back(out_edge);
  }

  if (sequence_nr != UINT64_MAX) {
    node_keys_[{node->thread_id(), record.sequence_nr}] = KeyedNode{id, node};
    if (node_keys_.size() >= prune_node_keys_at_) {
      for (auto it = node_keys_.begin(); it != node_keys_.end();) {
        it = nodes_.Find(it->second.address) == it->second.id ? std::next(it)
                                                                : node_keys_.erase(it);
      }
      prune_node_keys_at_ = std::max<size_t>(4096, 2 * node_keys_.size());
    }
  }
}

format::ObjectId Session::ExecutingNode(const at::RecordFunction& fn, format::InternId* name,
                                        NodeScratch& scratch, EncodedRecords& out,
                                        const void** address) {
  // The engine names the node it runs (NodeGuard, around the node's whole evaluation). The node
  // must be this function's: a node called directly (a user calling grad_fn, a hook calling a
  // node) runs outside that guard, or inside another node's.
  std::shared_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  if (!node || static_cast<int64_t>(node->sequence_nr()) != fn.seqNr() ||
      node->thread_id() != fn.forwardThreadId()) {
    return 0;
  }
  // Nodes without a sequence number (AccumulateGrad, GraphRoot) share the key: the name too.
  const std::string* text = nullptr;
  const format::InternId name_id = InternNodeName(*node, out, &text);
  if (fn.seqNr() < 0 && *text != fn.name()) return 0;
  *name = name_id;  // The function's name: the engine's RecordFunction is named node->name().
  *address = node.get();
  ObjectId id = nodes_.Find(node.get());
  if (id != 0) return id;
  // Never seen: a GraphRoot, or a node made before the recording started. Its record is written
  // now, before it runs and releases what it saved.
  id = RefNode(node.get(), nullptr, out, scratch);
  for (const format::NodeRecord& record : scratch) out.Add(record);
  scratch.size = 0;
  return id;
}

format::ObjectId Session::CreatorOf(uint64_t thread, uint64_t sequence_nr, bool custom) const {
  const size_t n = std::min<uint64_t>(recent_ops_count_, kRecentOps);
  format::ObjectId spanning = 0;     // The innermost op that spanned the number.
  format::ObjectId first_after = 0;  // The first op that started after the node was made.
  for (size_t i = 1; i <= n; ++i) {  // Latest first: nested ops end before theirs.
    const RecentOp& r = recent_ops_[(recent_ops_count_ - i) % kRecentOps];
    if (r.thread != thread) continue;
    if (r.sequence_at_end <= sequence_nr) break;  // This op, and all before it, ended before.
    if (sequence_nr >= r.sequence_at_start) {
      spanning = r.op;
    } else if (custom && r.sequence_at_start == sequence_nr + 1) {
      first_after = r.op;
    }
  }
  return spanning != 0 ? spanning : first_after;
}

void Session::QueueFingerprint(ObjectId node, format::InternId name, uint32_t list_index,
                               const at::Tensor& data, ObjectId tensor,
                               format::FingerprintWhen when) {
  PendingFingerprint pending;
  pending.record.node = node;
  pending.record.saved_name = name;
  pending.record.list_index = list_index;
  pending.record.storage = StorageId(*data.unsafeGetTensorImpl());
  pending.record.tensor = tensor;
  pending.record.when = when;
  pending.data = data;
  t_state->fingerprints.push_back(std::move(pending));  // Inside OnStart or OnEnd: it exists.
}

void Session::TakeFingerprints(EncodedRecords& out) {
  std::vector<PendingFingerprint> pending;
  pending.swap(t_state->fingerprints);  // Inside OnStart or OnEnd: it exists.
  for (PendingFingerprint& p : pending) {
    if (!verify_saved_.load(std::memory_order_relaxed)) return;
    std::string error;
    // torchrr's own kernels and copies: marked so that CUPTI's records of them are dropped.
    const bool own_cuda = cuda_tracer_ && p.data.is_cuda();
    if (own_cuda) cuda_tracer_->PushOp(kOwnCudaWork);
    FingerprintResult result = FingerprintTensorBytes(p.data, &p.record, &error);
    if (own_cuda) cuda_tracer_->PopOp();
    if (result == FingerprintResult::kFailed) {
      if (verify_saved_.exchange(false)) {
        std::fprintf(stderr,
                     "torchrr: warning: --verify-saved turned off: cannot fingerprint a saved "
                     "tensor: %s; recording goes on without fingerprints\n",
                     error.c_str());
      }
      return;
    }
    if (result != FingerprintResult::kDone) continue;
    p.record.time_ns = NowNs();
    out.Add(p.record);
  }
}

void Session::FingerprintAtUse(uint64_t forward_thread, int64_t sequence_nr,
                               EncodedRecords& out) {
  auto key = node_keys_.find({forward_thread, sequence_nr});
  if (key == node_keys_.end()) return;
  const auto* entry = nodes_.FindEntry(key->second.address);
  if (entry == nullptr || entry->id != key->second.id) return;
  std::shared_ptr<torch::autograd::Node> node = entry->weak.lock();
  if (!node) return;
  VisitSavedVariables(
      *node, [&](const char* name, uint32_t list_index, const torch::autograd::SavedVariable& sv) {
        if (!verify_saved_.load(std::memory_order_relaxed)) return;
        SavedVariableFacts facts = ReadSavedVariable(sv);
        if (facts.data == nullptr) return;
        QueueFingerprint(entry->id, InternString(name, out), list_index, *facts.data, 0,
                         format::FingerprintWhen::kAtUse);
      });
}

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
      wrapper.op.op = ++next_id_;
      wrapper.op.name = InternString(wrapper.deferred_name, out);
      wrapper.op.parent = parent;
      id = wrapper.op.op;
    }
    parent = id;
  }
  return parent;
}

std::unique_ptr<at::ObserverContext> Session::OnStart(const at::RecordFunction& fn,
                                                      ThreadState& ts) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  BusyGuard busy(ts);
  std::unique_ptr<OpFrame> frame;
  try {
    frame = TakeFrame(ts);
    format::OpRecord& op = frame->op;
    op.start_ns = NowNs();
    frame->uncaught_at_start = std::uncaught_exceptions();
    frame->sequence_at_start = at::sequence_number::peek();
    frame->thread = at::RecordFunction::currentThreadId();
    op.thread = static_cast<uint32_t>(fn.threadId());
    op.scope = ScopeOf(fn.scope());
    op.sequence_nr = fn.seqNr();
    op.forward_thread = fn.forwardThreadId();
    op.grad_mode = at::GradMode::is_enabled();
    op.parent = ts.op_stack.empty() ? 0 : ts.op_stack.back();

    // Stacks for top-level ops outside backward: nested ops share their top-level op's stack,
    // and ops run by autograd's engine have no user frames.
    uintptr_t pcs[kMaxNativeFrames];
    size_t n_pcs = 0;
    bool is_backward = op.scope == format::OpScope::kBackwardFunction;
    // An op inside record_function() ranges only (torch.optim's step, a user's profiler range)
    // is one the user called: it gets a stack too. So is an op directly inside the engine's
    // wrapper around a node (a tensor or node hook's), while the wrapper, autograd's own, has none.
    bool outermost = ts.op_stack.size() == ts.transparent_scopes;
    const bool engine_wrapper = outermost && IsEngineWrapper(fn, op.scope, op.sequence_nr);
    frame->transparent = op.scope == format::OpScope::kUserScope || engine_wrapper;
    const bool wants_stack = outermost && !is_backward && !engine_wrapper;
    // An engine wrapper around only its node's backward function says nothing that function's
    // record does not: it is recorded when another op runs in it (RecordDeferredWrapper).
    if (engine_wrapper && !records_all_ops()) {
      frame->deferred = true;
      frame->deferred_name = fn.name();
      ts.deferred_wrappers.push_back(frame.get());
      ts.op_stack.push_back(0);
      ts.op_scopes.push_back(op.scope);
      ++ts.transparent_scopes;
      frame->active = true;
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      return OpHandle::Make(ts, std::move(frame));
    }
    if (options_.native_stacks && wants_stack && ts.backward_depth == 0) {
      n_pcs = CaptureNativeStack(pcs, kMaxNativeFrames, 3);
    }

    PythonFrame* py_frames = ts.python_frames.data();  // Not cleared per op: n_py says how many.
    size_t n_py = 0;
    std::vector<PythonCode> new_codes;
    if (options_.python_stacks && wants_stack) {
      n_py = CapturePythonStack(py_frames, kMaxPythonFrames, &new_codes);  // No lock held.
    }

    c10::ArrayRef<const c10::IValue> inputs = InputsOf(fn);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& code : new_codes) python_codes_[code.code] = std::move(code);
    if (!is_backward && op.parent == 0 && !ts.op_stack.empty() && ts.op_stack.back() == 0) {
      op.parent = RecordDeferredWrapper(ts, frame->before);
    }
    op.op = ++next_id_;
    if (op.scope == format::OpScope::kFunction) {
      // An ATen op's name and overload point into its registered schema: stable pointers.
      op.name = InternOpName(fn.name(), frame->before);
      op.overload = InternOpName(fn.overload_name(), frame->before);
    } else {
      // OnEnd's node scratch is free between ops.
      if (is_backward) {
        frame->exec_node =
            ExecutingNode(fn, &op.name, ts.nodes, frame->before, &frame->exec_node_address);
      }
      // Node names and user scopes are strings the RecordFunction owns: intern by content (a
      // backward function the engine runs has its node's, found above).
      if (op.name == 0) op.name = InternString(fn.name(), frame->before);
    }
    op.stack = InternStack(pcs, n_pcs, py_frames, n_py, frame->before);
    // Before the node's apply() unpacks (and maybe releases) what it saved.
    if (is_backward && verify_saved_.load(std::memory_order_relaxed)) {
      FingerprintAtUse(op.forward_thread, op.sequence_nr, frame->before);
    }

    auto add_tensor = [&](const at::Tensor& t, uint16_t position, uint16_t list_index) {
      if (!t.defined()) return;
      format::TensorUse use;
      use.tensor = RefTensor(t, frame->before);
      use.position = position;
      use.list_index = list_index;
      auto counter = StrongVersionCounter(*t.unsafeGetTensorImpl());
      use.version_before = ReadVersionCounter(counter.get());
      use.version_after = use.version_before;
      op.inputs.push_back(use);
      frame->input_counters.push_back(std::move(counter));
    };
    // One allocation each for the common case (no tensor lists).
    size_t n_tensors = 0;
    for (const c10::IValue& v : inputs) n_tensors += v.isTensor() ? 1 : 0;
    op.inputs.reserve(n_tensors);
    frame->input_counters.reserve(n_tensors);
    op.values.reserve(inputs.size() - n_tensors);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const c10::IValue& v = inputs[i];
      auto position = static_cast<uint16_t>(i);
      if (v.isTensor()) {
        add_tensor(v.toTensor(), position, format::TensorUse::kNotInList);
        continue;
      }
      if (v.isTensorList()) {
        auto list = v.toTensorList();
        for (size_t j = 0; j < list.size(); ++j) {
          add_tensor(list.get(j), position, static_cast<uint16_t>(j));
        }
        continue;
      }
      if (v.isList()) {
        auto list = v.toListRef();
        bool has_tensor = false;
        for (size_t j = 0; j < list.size(); ++j) {
          if (list[j].isTensor()) {
            add_tensor(list[j].toTensor(), position, static_cast<uint16_t>(j));
            has_tensor = true;
          }
        }
        if (has_tensor) continue;
      }
      format::Value value;
      value.position = position;
      auto take_ints = [&frame, &value] {
        if (frame->spare_ints.empty()) return;
        value.ints = std::move(frame->spare_ints.back());
        frame->spare_ints.pop_back();
        value.ints.clear();
      };
      if (v.isNone()) {
        value.kind = format::ValueKind::kNone;
      } else if (v.isBool()) {
        value.kind = format::ValueKind::kBool;
        value.i = v.toBool();
      } else if (v.isInt()) {
        value.kind = format::ValueKind::kInt;
        value.i = v.toInt();
      } else if (v.isDouble()) {
        value.kind = format::ValueKind::kDouble;
        value.d = v.toDouble();
      } else if (v.isComplexDouble()) {
        value.kind = format::ValueKind::kComplex;
        auto c = v.toComplexDouble();
        value.d = c.real();
        value.d_imag = c.imag();
      } else if (v.isString()) {
        value.kind = format::ValueKind::kString;
        value.s = InternString(v.toStringRef(), frame->before);
      } else if (v.isIntList()) {
        value.kind = format::ValueKind::kIntList;
        const auto ints = v.toIntList();  // A reference to the list, not a copy of it.
        take_ints();
        value.ints.reserve(ints.size());
        for (size_t j = 0; j < ints.size(); ++j) value.ints.push_back(ints.get(j));
      } else if (v.isDoubleList()) {
        value.kind = format::ValueKind::kDoubleList;
        auto doubles = v.toDoubleVector();
        value.doubles.assign(doubles.begin(), doubles.end());
      } else if (v.isBoolList()) {
        value.kind = format::ValueKind::kBoolList;
        take_ints();
        for (bool b : v.toBoolList()) value.ints.push_back(b);
      } else if (v.isDevice()) {
        value.kind = format::ValueKind::kDevice;
        auto device = v.toDevice();
        value.i = static_cast<int64_t>(device.type()) * 256 + (device.has_index() ? device.index() : 255);
      } else {
        value.kind = format::ValueKind::kOther;
        value.s = InternString(v.tagKind(), frame->before);
      }
      op.values.push_back(std::move(value));
    }
    // The definitions and the inputs' metadata go out now, before the records of the ops nested
    // in this one (which end, and are written, first) can name them or describe those inputs
    // as they changed.
    if (!frame->before.empty()) PushGroupLocked(frame->before);
    ts.op_stack.push_back(op.op);
    ts.op_scopes.push_back(op.scope);
    if (frame->transparent) ++ts.transparent_scopes;
    if (is_backward) ++ts.backward_depth;
    frame->active = true;
  } catch (const std::exception& e) {
    Degrade(std::string("internal error at an op's start: ") + e.what());
    frame.reset();
    ts.fingerprints.clear();
  }
  // Outside mu_: hashing saved bytes (on CUDA, a kernel and a wait) blocks no other thread.
  if (frame && !ts.fingerprints.empty()) TakeFingerprints(frame->before);
  // Last: CUDA work launched from here on is this op's.
  if (frame && cuda_tracer_) cuda_tracer_->PushOp(frame->op.op);
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (!frame) return nullptr;
  return OpHandle::Make(ts, std::move(frame));
}

void Session::OnEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts) {
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  if (cuda_tracer_ && !frame.deferred) cuda_tracer_->PopOp();  // A deferred wrapper pushed none.
  BusyGuard busy(ts);
  format::OpRecord& op = frame.op;
  bool is_backward = op.scope == format::OpScope::kBackwardFunction;
  if (!ts.op_stack.empty() && ts.op_stack.back() == op.op) {
    ts.op_stack.pop_back();
    ts.op_scopes.pop_back();
    if (frame.transparent && ts.transparent_scopes > 0) --ts.transparent_scopes;
  }
  if (is_backward && ts.backward_depth > 0) --ts.backward_depth;
  frame.active = false;
  if (frame.deferred) {
    ts.EndDeferredWrapper(&frame);
    if (op.op == 0) {  // Nothing but its node's backward function ran in it: not recorded.
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
  }
  if (!recording()) {
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  try {
    op.end_ns = NowNs();
    op.threw = std::uncaught_exceptions() > frame.uncaught_at_start;
    frame.sequence_at_end = at::sequence_number::peek();
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      op.inputs[i].version_after = ReadVersionCounter(frame.input_counters[i].get());
    }
    frame.input_counters.clear();

    EncodedRecords& group = ts.group;
    EncodedRecords& after = ts.after;  // Also the definitions the nodes name.
    NodeScratch& nodes = ts.nodes;
    std::vector<ThreadState::Output>& touched = ts.outputs;  // Parallel to op.outputs.
    // Whatever happens below, the scratch vectors are left empty (and the tensors released).
    struct ClearScratch {
      ~ClearScratch() {
        state.group.clear();
        state.after.clear();
        state.nodes.size = 0;
        state.outputs.clear();
      }
      ThreadState& state;
    } clear_scratch{ts};
    group.AddAll(frame.before);
    frame.before.clear();
    const auto& outputs = fn.outputs();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Outputs, in order: tensors and the positions they came from.
      for (size_t i = 0; i < outputs.size(); ++i) {
        const c10::IValue& v = outputs[i];
        if (v.isTensor()) {
          if (!v.toTensor().defined()) continue;
          touched.push_back(
              {c10::MaybeOwned<at::Tensor>::borrowed(v.toTensor()), static_cast<uint16_t>(i)});
        } else if (v.isTensorList()) {
          auto list = v.toTensorList();
          for (size_t j = 0; j < list.size(); ++j) {
            at::Tensor t = list.get(j);
            if (!t.defined()) continue;
            touched.push_back({c10::MaybeOwned<at::Tensor>::owned(std::move(t)),
                               static_cast<uint16_t>(i), static_cast<uint16_t>(j)});
          }
        }
      }
      // The nodes this op created, first (so the outputs' TensorInfo can name them): the outputs'
      // grad_fn, and for an in-place op on a view the CopySlices autograd put on the view's base.
      for (const ThreadState::Output& output : touched) {
        const at::Tensor& t = *output.tensor;
        torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(t);
        if (grad_fn != nullptr) RefNode(grad_fn, &frame, after, nodes);
        if (t.is_view()) {
          auto* view_meta = torch::autograd::impl::get_view_autograd_meta(t);
          if (view_meta != nullptr && view_meta->has_bw_view()) {
            const at::Tensor& base = view_meta->get_backward_view().base_;
            torch::autograd::Node* base_fn = torch::autograd::impl::grad_fn_unsafe(base);
            if (base_fn != nullptr) RefNode(base_fn, &frame, after, nodes);
            RefTensor(base, after);
          }
        }
      }
      op.outputs.reserve(touched.size());
      for (ThreadState::Output& output : touched) {
        const at::Tensor& t = *output.tensor;
        format::TensorUse use;
        use.tensor = RefTensor(t, after, &output.storage, &output.version_counter);
        use.position = output.position;
        use.list_index = output.list_index;
        use.version_after = ReadVersionCounter(VersionCounterOf(*t.unsafeGetTensorImpl()));
        use.version_before = use.version_after;
        for (const auto& in : op.inputs) {  // An in-place op returns its input.
          if (in.tensor == use.tensor) use.version_before = in.version_before;
        }
        op.outputs.push_back(use);
      }
      // A saved output names the output tensor the program holds.
      for (format::NodeRecord& node : nodes) {
        for (auto& saved : node.saved) {
          if (saved.tensor != 0 || saved.version_counter == 0) continue;
          for (size_t i = 0; i < touched.size(); ++i) {
            if (touched[i].version_counter == saved.version_counter &&
                touched[i].storage == saved.storage) {
              saved.tensor = op.outputs[i].tensor;
              break;
            }
          }
        }
      }

      format::NodeExecRecord exec;
      bool has_exec = false;
      if (is_backward) {
        has_exec = true;
        exec.node = frame.exec_node;
        if (exec.node == 0) {  // Not the engine's node: by the key the function carries.
          auto it = node_keys_.find({op.forward_thread, op.sequence_nr});
          if (it != node_keys_.end() && nodes_.Find(it->second.address) == it->second.id) {
            exec.node = it->second.id;
          }
        }
        // It ran: the replayer stops watching its saved tensors' storages here, whose ids can be
        // given again once those storages die.
        if (frame.exec_node != 0) {
          auto* entry = nodes_.FindEntry(frame.exec_node_address);
          if (entry != nullptr && entry->id == frame.exec_node) {
            for (const NodeState::Pin& pin : entry->extra.pinned_storages) {
              storages_.Unpin(pin.address, pin.id);
            }
            entry->extra.pinned_storages.clear();
          }
        }
        exec.op = op.op;
        exec.thread = op.thread;
        exec.start_ns = op.start_ns;
        exec.end_ns = op.end_ns;
        exec.threw = op.threw;
      }
      // Order: the fingerprints taken at the start (before), the definitions and the outputs'
      // metadata as the op left them, the nodes it created (whose saved tensors those describe),
      // the op itself. Pushed under mu_: no other thread names what this group defines before
      // the group is in the queue.
      group.AddAll(after);
      for (const format::NodeRecord& node : nodes) group.Add(node);
      group.Add(op);
      if (has_exec) group.Add(exec);
      PushGroupLocked(group);
      recent_ops_[recent_ops_count_++ % kRecentOps] = {frame.thread, op.op,
                                                        frame.sequence_at_start,
                                                        frame.sequence_at_end};
    }
    ops_recorded_.fetch_add(1, std::memory_order_relaxed);
    // Outside mu_ (hashing bytes blocks no other thread); after the NodeRecords they name.
    if (!ts.fingerprints.empty()) {
      TakeFingerprints(group);
      std::lock_guard<std::mutex> lock(mu_);
      if (!group.empty()) PushGroupLocked(group);
    }
    if (cuda_tracer_) MaybeFlushCuda();
  } catch (const std::exception& e) {
    Degrade(std::string("internal error at an op's end: ") + e.what());
    ts.fingerprints.clear();
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace torchrr::recorder
