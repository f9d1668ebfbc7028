// IdRegistry: the ids of the objects a trace names (tensors, storages, version counters, autograd
// nodes and ops), and the TensorInfo records that describe tensors.
//
// Ids come from one counter, in the order objects are first seen. Each table keeps a weak
// reference per object, so an id names one object and a new object at a freed one's address gets
// a new id (storages excepted: SPEC.md, Ids). A tensor's metadata is written again whenever it
// changes, so the last TensorInfo before a record is the tensor's state then.
//
// Not thread-safe: the session calls it with its mutex held.
#ifndef TORCHRR_RECORDER_ID_REGISTRY_H_
#define TORCHRR_RECORDER_ID_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/function.h>

#include "capture/object_ids.h"
#include "capture/wrapper_tensors.h"
#include "internals/torch_compat.h"
#include "sink/record_bytes.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

class IdRegistry {
 public:
  // `data_addresses`: while true, TensorInfos carry their bytes' address (verify_saved: a write
  // through another storage over the same memory can then be named). Not otherwise: it costs
  // trace bytes. Read at each use; it may turn false while recording.
  explicit IdRegistry(const std::atomic<bool>& data_addresses) : data_addresses_(data_addresses) {}

  // A fresh id, for an object no table keeps (an op).
  format::ObjectId NewId() { return ++next_id_; }

  // The tensor's id; writes a TensorInfo to `out` when the tensor is new or its metadata changed.
  // Also its storage's and version counter's ids, where asked. 0 for an undefined tensor. A
  // wrapper subclass found in `inners` names the tensor it wraps (whose TensorInfo goes first);
  // one not there keeps the one it named before.
  format::ObjectId RefTensor(const at::Tensor& tensor, EncodedRecords& out,
                             format::ObjectId* storage_id = nullptr,
                             format::ObjectId* counter_id = nullptr,
                             const WrapperInners* inners = nullptr);

  // What a node's entry keeps: the storages its saved tensors pinned (StorageId), unpinned when
  // it runs (UnpinSavedStorages).
  struct NodeState {
    struct Pin {
      const void* address = nullptr;
      format::ObjectId id = 0;
    };
    c10::SmallVector<Pin, 2> pinned_storages;
  };
  using NodeTable = ObjectIdTable<compat::WeakNodePtr, NodeState>;

  // The id of the tensor's storage (0: none). With `pinned_for`, a saved tensor's storage, pinned
  // for that node until it runs: the replayer watches the storage from the save to the node's run,
  // and a node that never runs stays watched, so the id of a storage that dies before its node
  // runs is never given again.
  format::ObjectId StorageId(const c10::TensorImpl& impl, NodeState* pinned_for = nullptr);
  format::ObjectId VersionCounterId(const c10::TensorImpl& impl);

  // The node's entry, created (with a fresh id) when the node is new; `created` says which. An
  // insertion may move entries: the reference is valid until the next LookupNode.
  NodeTable::Entry& LookupNode(torch::autograd::Node* node, bool& created) {
    return nodes_.Lookup(node, [&] { return compat::WeakRef(node); }, next_id_, created);
  }
  // The id of a live node already seen, or 0.
  format::ObjectId FindNode(const void* node) const { return nodes_.Find(node); }
  NodeTable::Entry* FindNodeEntry(const void* node) { return nodes_.FindEntry(node); }
  // The node `id` at `node` ran: the replayer stops watching its saved tensors' storages there,
  // whose ids can be given again once those storages die.
  void UnpinSavedStorages(const void* node, format::ObjectId id);

  // After a dropped group: tensors keep their ids but their metadata is written again on next use.
  void ForgetMetadata() { tensors_.ResetExtras(); }
  // Forgets every object (the recording stopped): releases the weak references.
  void Clear();

 private:
  // What RefTensor keeps per tensor: the ids it last wrote, a 64-bit hash of the rest of the
  // metadata it last wrote (compared with the tensor's: a TensorInfo is written when they differ),
  // and the addresses of the StorageImpl and version counter it names with their tables'
  // generations for those addresses then (and of its grad_fn). A tensor that still holds the same
  // objects, with no removal there since, has the same ids (see ObjectIdTable::Generation): most
  // uses skip those three lookups. Small, because every lookup reads it and the table holds one
  // per live tensor: a larger entry pushes the kernels' data out of the cache.
  struct TensorState {
    uint64_t metadata_hash = 0;
    format::ObjectId storage = 0;
    format::ObjectId version_counter = 0;
    format::ObjectId grad_fn = 0;
    format::ObjectId inner = 0;  // A wrapper subclass's wrapped tensor.
    const void* storage_impl = nullptr;  // StorageImpl*, not the data pointer.
    const void* counter_impl = nullptr;
    const void* grad_fn_node = nullptr;  // The Node: the tensor holds it while it is its grad_fn.
    uint64_t storage_generation = 0;
    uint64_t counter_generation = 0;
    uint64_t grad_fn_generation = 0;
    bool written = false;  // False also after ForgetMetadata(): the next use writes it again.
  };

  const std::atomic<bool>& data_addresses_;
  format::ObjectId next_id_ = 0;
  // Most tensors (and their version counters) die within a few ops: each entry is looked at again
  // 128 insertions later (ObjectIdTable's recheck), so that a dead object's memory goes back to the
  // allocator soon.
  ObjectIdTable<c10::weak_intrusive_ptr<c10::TensorImpl>, TensorState> tensors_{128};
  format::TensorInfo tensor_info_;  // RefTensor's record, before it is encoded.
  // Storages are pinned only once saved (AddressIdTable). 2^16 addresses: about 3 MiB of table.
  AddressIdTable<c10::weak_intrusive_ptr<c10::StorageImpl>> storages_{size_t{1} << 16};
  ObjectIdTable<c10::weak_intrusive_ptr<c10::intrusive_ptr_target>> counters_{128};
  NodeTable nodes_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_ID_REGISTRY_H_
