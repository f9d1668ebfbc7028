// Session: one recording, from the moment its RecordFunction callbacks are registered to Stop().
//
// The callbacks run on every thread that dispatches an op (training threads, autograd's worker
// threads, the optimizer). The start callback takes what is only valid then (the inputs, their
// versions, the stack) and hands the TraceSink what it defined (strings, stacks, the inputs'
// metadata when new or changed) before any op nested in this one runs; the end callback adds the
// outputs, the versions after the op, the autograd nodes the op created (with what each saved)
// and, for a node running in backward, its execution, and hands them over in one group. Shared
// tables (ids, interned strings and stacks) are guarded by one mutex taken once per callback;
// groups are handed over under it, so a definition reaches the trace before any use of it.
//
// Nothing here throws into the program or aborts it: a callback that fails stops the recording
// with one warning.
#ifndef TORCHRR_RECORDER_SESSION_H_
#define TORCHRR_RECORDER_SESSION_H_

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <torch/csrc/autograd/function.h>

#include "cupti_tracer.h"
#include "object_ids.h"
#include "python_stacks.h"
#include "torchrr/format/records.h"
#include "torchrr/recorder.h"
#include "trace_sink.h"

namespace torchrr::recorder {

struct OpFrame;
struct NodeScratch;
struct ThreadState;  // A thread's op stack, pools and scratch (session.cc).

inline constexpr size_t kMaxPythonFrames = 48;
// The CUPTI external correlation id of torchrr's own CUDA work (fingerprints): dropped.
inline constexpr uint64_t kOwnCudaWork = ~uint64_t{0};

class Session {
 public:
  // Opens the trace and registers the callbacks. Returns nullptr (and sets *error) when the trace
  // cannot be opened or another session is recording.
  static std::shared_ptr<Session> Start(const RecorderOptions& options, std::string* error);
  ~Session();

  // Unregisters the callbacks, waits for callbacks in flight, closes the trace. Idempotent.
  void Stop();
  bool recording() const { return recording_.load(std::memory_order_acquire); }
  // RecorderOptions::all_ops, or verify_saved (a write that no counter sees may come
  // from such an op).
  bool records_all_ops() const {
    return options_.all_ops || options_.verify_saved;
  }

  void RecordError(format::ErrorKind kind, const std::string& type, const std::string& message);

  uint64_t ops_recorded() const { return ops_recorded_.load(std::memory_order_relaxed); }
  uint64_t records_dropped() const { return sink_ ? sink_->dropped_records() : 0; }

  // True on a thread that is inside an op this session records (and not inside torchrr's own
  // code): an exception thrown there comes out of that op.
  static bool ThreadInsideRecordedOp();

  // The session recording now, or nullptr. Used by the callbacks, the terminate handler and the
  // Python bindings.
  static std::shared_ptr<Session> Active();

  // Callback bodies (public for the static trampolines).
  std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn, ThreadState& ts);
  void OnEnd(const at::RecordFunction& fn, OpFrame& frame, ThreadState& ts);

 private:
  explicit Session(const RecorderOptions& options);
  // Stops with one warning; for failures inside callbacks.
  void Degrade(const std::string& why);
  // Hands `group` over and clears it. Called with mu_ held, so that groups reach the trace in the
  // order their definitions were made, on every thread. Groups gather in pending_ and go to the
  // sink pending_bytes_ at a time (one sink lock per batch, not per op); the writer thread takes
  // what is pending each time it looks at the queue (PullPending), so a batch waits no longer than
  // the queue's own poll.
  void PushGroupLocked(EncodedRecords& group);
  void FlushPendingLocked(bool may_wait);
  void PullPending();  // The writer thread's: skips when mu_ is busy.

  // All of the following run with mu_ held.
  // Records the deferred engine wrappers on the thread's op stack (their ids, names and parents,
  // for the records their ends write), the innermost on top of it; returns the top's id.
  format::ObjectId RecordDeferredWrapper(ThreadState& ts, EncodedRecords& out);
  format::InternId InternString(std::string_view text, EncodedRecords& out);
  format::InternId InternOpName(const char* name, EncodedRecords& out);
  // The node's name() interned, looked up by the node's C++ type (name() builds a string, often on
  // the heap); the names of Python functions' nodes (PyNode), which differ per class, are built
  // each time. `text`, when given, receives the name.
  format::InternId InternNodeName(const torch::autograd::Node& node, EncodedRecords& out,
                                  const std::string** text = nullptr,
                                  bool* accumulate_grad = nullptr);
  format::InternId InternStack(const uintptr_t* pcs, size_t n_pcs, const PythonFrame* py,
                               size_t n_py, EncodedRecords& out);
  // The tensor's id; writes a TensorInfo when the tensor is new or its metadata changed. Also its
  // storage's and version counter's ids, where asked.
  format::ObjectId RefTensor(const at::Tensor& tensor, EncodedRecords& out,
                             format::ObjectId* storage_id = nullptr,
                             format::ObjectId* counter_id = nullptr);
  struct NodeState;  // What a node's id table entry keeps (below).
  // The id of the tensor's storage (0: none). With `pinned_for`, a saved tensor's storage, pinned
  // for that node until it runs: the replayer watches the storage from the save to the node's run,
  // and a node that never runs stays watched, so the id of a storage that dies before its node
  // runs is never given again.
  format::ObjectId StorageId(const c10::TensorImpl& impl, NodeState* pinned_for = nullptr);
  format::ObjectId VersionCounterId(const c10::TensorImpl& impl);
  // The node's id; on first sight adds its NodeRecord (and those of unseen nodes it reaches) to
  // `nodes`, and the definitions and TensorInfos they name to `defs`, which is written first.
  // `creator` is the op whose end this is (nullptr outside an op end).
  format::ObjectId RefNode(torch::autograd::Node* node, const OpFrame* creator,
                           EncodedRecords& defs, NodeScratch& nodes);
  // A backward function at its start: the id of the node autograd's engine is running for it
  // (recorded now, into `out`, if never seen: `scratch` is left empty), or 0 when the engine is not
  // running it; `address` receives the node's address.
  format::ObjectId ExecutingNode(const at::RecordFunction& fn, format::InternId* name,
                                 NodeScratch& scratch, EncodedRecords& out,
                                 const void** address);
  // A node first seen after its creating op ended (found through another node's edges, or as an
  // input's grad_fn): the op that spanned its sequence number on its thread, innermost first (a
  // Python Function.apply is such an op). A C++ torch::autograd::Function's apply is not an op:
  // its node takes the number and its forward runs ops after it; for a custom node, the first op
  // that started with the next number stands for it. 0 when no recent op (recent_ops_) fits.
  format::ObjectId CreatorOf(uint64_t thread, uint64_t sequence_nr, bool custom) const;
  // `state`: the node's nodes_ entry's (the storages its saved tensors pin), or nullptr.
  void WriteNodeRecord(torch::autograd::Node* node, format::ObjectId id, NodeState* state,
                       const OpFrame* creator, std::vector<torch::autograd::Node*>& pending,
                       EncodedRecords& defs, NodeScratch& nodes);
  // CUDA work from CUPTI: interned and pushed as groups of their own.
  class CudaSink;
  void StartCudaTracer();
  void MaybeFlushCuda();
  void ForgetInterned();  // After a dropped group: everything is defined again on next use.
  // verify_saved: queues the fingerprint of one saved tensor (node, name, list index) on this
  // thread, under mu_; TakeFingerprints() computes the queued ones, without mu_, and appends their
  // FingerprintRecords to `out` (nothing for bytes it cannot read). A CUDA failure turns
  // verification off, once.
  void QueueFingerprint(format::ObjectId node, format::InternId name, uint32_t list_index,
                        const at::Tensor& data, format::ObjectId tensor,
                        format::FingerprintWhen when);
  void TakeFingerprints(EncodedRecords& out);
  // verify_saved, at a backward function's start: queues the fingerprints of what its node saved
  // (names interned into `out`).
  void FingerprintAtUse(uint64_t forward_thread, int64_t sequence_nr,
                        EncodedRecords& out);

  const RecorderOptions options_;
  std::unique_ptr<TraceSink> sink_;
  std::atomic<bool> recording_{false};
  std::atomic<bool> verify_saved_{false};
  std::unique_ptr<CudaSink> cuda_sink_;
  // Set before the callbacks are registered, reset after they are gone: read without a lock.
  std::unique_ptr<CudaActivityTracer> cuda_tracer_;
  std::atomic<int64_t> last_cuda_flush_ns_{0};  // options_.verify_saved until a fingerprint fails.
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> ops_recorded_{0};
  at::CallbackHandle callback_handle_ = 0;
  std::once_flag stop_once_;

  std::mutex mu_;
  format::ObjectId next_id_ = 0;  // Guarded by mu_.
  EncodedRecords pending_;        // Guarded by mu_: groups not yet handed to the sink.
  size_t pending_bytes_ = 0;      // When pending_ goes to the sink (set at start).
  // Looked up by string_view: a name the callbacks get as a char* is not copied to be looked up.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>()(text); }
  };
  std::unordered_map<std::string, format::InternId, StringHash, std::equal_to<>>
      strings_;  // Guarded by mu_.
  struct OpName {
    format::InternId id = 0;
    std::string text;  // What the pointer pointed to then (InternOpName).
  };
  ska::flat_hash_map<const char*, OpName> op_names_;               // Guarded by mu_.
  struct NodeTypeName {
    format::InternId id = 0;
    std::string text;
    bool per_instance = false;  // PyNode: name() is the Python class's.
    bool accumulate_grad = false;
  };
  ska::flat_hash_map<const std::type_info*, NodeTypeName> node_type_names_;  // Guarded by mu_.
  std::string node_name_;  // Guarded by mu_: InternNodeName's, for names built each time.
  ska::flat_hash_map<uintptr_t, format::InternId> frames_;         // Guarded by mu_.
  ska::flat_hash_map<uint64_t, format::InternId> python_frames_;   // Guarded by mu_: code, line.
  std::unordered_map<uint32_t, PythonCode> python_codes_;          // Guarded by mu_; never cleared.
  std::unordered_map<std::string, format::InternId> stacks_;       // Guarded by mu_ (key: pcs).
  std::string stack_key_;  // Guarded by mu_: InternStack's key, reused (no allocation per op).
  format::InternId next_stack_id_ = 0;                             // Guarded by mu_.
  // What RefTensor keeps per tensor: the ids it last wrote, a 64-bit hash of the rest of the
  // metadata it last wrote (compared with the tensor's: a TensorInfo is written when they differ),
  // and the addresses of the StorageImpl and version counter it names with their tables'
  // generations for those addresses then (and of its grad_fn). A tensor that still holds the same
  // objects, with no removal there since, has the same ids (see ObjectIdTable::Generation): most
  // uses skip those three lookups. Small (every lookup reads it, and the table holds one per
  // live tensor): it was 4 cache lines with the shapes and strides kept field by field, and the
  // table's traffic pushed the kernels' data out of the cache.
  struct TensorState {
    uint64_t metadata_hash = 0;
    format::ObjectId storage = 0;
    format::ObjectId version_counter = 0;
    format::ObjectId grad_fn = 0;
    const void* storage_impl = nullptr;  // StorageImpl*, not the data pointer.
    const void* counter_impl = nullptr;
    const void* grad_fn_node = nullptr;  // The Node: the tensor holds it while it is its grad_fn.
    uint64_t storage_generation = 0;
    uint64_t counter_generation = 0;
    uint64_t grad_fn_generation = 0;
    bool written = false;  // False also after ForgetInterned(): the next use writes it again.
  };
  // Most tensors (and their version counters) die within a few ops: each entry is looked at again
  // 128 insertions later (ObjectIdTable's recheck), so that a dead object's memory goes back to the
  // allocator soon.
  ObjectIdTable<c10::weak_intrusive_ptr<c10::TensorImpl>, TensorState> tensors_{128};
  format::TensorInfo tensor_info_;  // Guarded by mu_: RefTensor's record, before it is encoded.
  // Storages are pinned only once saved (AddressIdTable). 2^16 addresses: about 3 MiB of table.
  AddressIdTable<c10::weak_intrusive_ptr<c10::StorageImpl>> storages_{size_t{1} << 16};
  ObjectIdTable<c10::weak_intrusive_ptr<c10::intrusive_ptr_target>> counters_{128};
  // A node's entry keeps the storages its saved tensors pinned (StorageId), unpinned when it
  // runs (OnEnd of its backward function).
  struct NodeState {
    struct Pin {
      const void* address = nullptr;
      format::ObjectId id = 0;
    };
    c10::SmallVector<Pin, 2> pinned_storages;
  };
  ObjectIdTable<std::weak_ptr<torch::autograd::Node>, NodeState> nodes_;
  // (forward thread, sequence_nr) -> node: the key a backward function carries.
  struct NodeKeyHash {
    size_t operator()(const std::pair<uint64_t, int64_t>& key) const {
      return std::hash<uint64_t>()(key.first * 0x9e3779b97f4a7c15ULL ^
                                   static_cast<uint64_t>(key.second));
    }
  };
  struct KeyedNode {
    format::ObjectId id = 0;
    const void* address = nullptr;  // To check, with nodes_, that the node is still alive.
  };
  ska::flat_hash_map<std::pair<uint64_t, int64_t>, KeyedNode, NodeKeyHash> node_keys_;  // mu_.
  // The last ops to end, with the sequence numbers they spanned: who created a node first seen
  // after its creating op ended (CreatorOf). Guarded by mu_.
  struct RecentOp {
    uint64_t thread = 0;
    format::ObjectId op = 0;
    uint64_t sequence_at_start = 0;
    uint64_t sequence_at_end = 0;
  };
  static constexpr size_t kRecentOps = 1024;
  std::array<RecentOp, kRecentOps> recent_ops_{};
  uint64_t recent_ops_count_ = 0;  // Guarded by mu_.
  size_t prune_node_keys_at_ = 4096;  // Guarded by mu_.
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_SESSION_H_
