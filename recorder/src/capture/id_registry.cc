#include "capture/id_registry.h"

#include <array>
#include <optional>

#include <torch/csrc/autograd/variable.h>

#define XXH_INLINE_ALL  // XXH3 on a few words: inlined.
#include <xxhash.h>

#include "internals/torch_internals.h"

namespace torchrr::recorder {
namespace {

// What a TensorInfo says of a tensor besides its ids.
struct TensorMetadata {
  uint32_t output_nr = 0;
  int8_t device_type = 0;
  int8_t device_index = -1;
  format::DType dtype = 0;
  uint64_t nbytes = 0;
  uint64_t data_address = 0;
  bool requires_grad = false;
  bool is_leaf = false;
  bool strided = false;
  int64_t storage_offset = 0;
  c10::IntArrayRef sizes;
  c10::IntArrayRef strides;
};

TensorMetadata ReadMetadata(const at::Tensor& tensor, bool is_leaf, bool data_address) {
  const c10::TensorImpl& impl = *tensor.unsafeGetTensorImpl();
  TensorMetadata m;
  m.strided = impl.layout() == c10::kStrided;
  m.output_nr = impl.autograd_meta() != nullptr ? tensor.output_nr() : 0;
  const c10::Device device = impl.device();
  m.device_type = static_cast<int8_t>(device.type());
  m.device_index = device.has_index() ? device.index() : -1;
  m.dtype = static_cast<format::DType>(impl.dtype().toScalarType());
  m.requires_grad = impl.requires_grad();
  m.is_leaf = is_leaf;
  // Tensors whose sizes are custom (nested tensors, wrapper subclasses, FakeTensor's symbolic
  // shapes) throw from these instead of answering: such a tensor is recorded without its shape,
  // strides and bytes, which the replayer's checks do not need (ids and versions).
  try {
    m.nbytes = impl.has_storage() ? impl.unsafe_storage().nbytes() : 0;
    m.data_address = data_address && impl.has_storage()
                         ? reinterpret_cast<uint64_t>(impl.unsafe_storage().data())
                         : 0;
    m.storage_offset = m.strided ? impl.storage_offset() : 0;
    if (m.strided) {
      m.sizes = impl.sizes();
      m.strides = impl.strides();
    }
  } catch (const c10::Error&) {
    m.strided = false;
    m.nbytes = m.data_address = 0;
    m.storage_offset = 0;
    m.sizes = m.strides = {};
  }
  return m;
}

// The metadata hashed (sizes and strides as far as kMaxHashedDims go, and their count); false when
// the tensor has more dimensions (rare: such a tensor is written at every use).
bool HashMetadata(const TensorMetadata& m, uint64_t* hash) {
  constexpr size_t kMaxHashedDims = 12;
  if (m.sizes.size() > kMaxHashedDims || m.strides.size() > kMaxHashedDims) return false;
  std::array<int64_t, 6 + 2 * kMaxHashedDims> words;
  size_t n = 0;
  words[n++] = static_cast<int64_t>(m.output_nr) | (int64_t{static_cast<uint8_t>(m.dtype)} << 32) |
               (int64_t{static_cast<uint8_t>(m.device_type)} << 40) |
               (int64_t{static_cast<uint8_t>(m.device_index)} << 48) |
               (int64_t{m.requires_grad} << 56) | (int64_t{m.is_leaf} << 57) |
               (int64_t{m.strided} << 58);
  words[n++] = static_cast<int64_t>(m.nbytes);
  words[n++] = static_cast<int64_t>(m.data_address);
  words[n++] = m.storage_offset;
  words[n++] = static_cast<int64_t>(m.sizes.size() | (m.strides.size() << 16));
  for (int64_t v : m.sizes) words[n++] = v;
  for (int64_t v : m.strides) words[n++] = v;
  *hash = XXH3_64bits(words.data(), n * sizeof(int64_t));
  return true;
}

void FillTensorInfo(const TensorMetadata& m, format::TensorInfo& info) {
  info.dtype = m.dtype;
  info.device.type = m.device_type;
  info.device.index = m.device_index;
  info.shape.assign(m.sizes.begin(), m.sizes.end());
  info.strides.assign(m.strides.begin(), m.strides.end());
  info.storage_offset = m.storage_offset;
  info.requires_grad = m.requires_grad;
  info.is_leaf = m.is_leaf;
  info.output_nr = m.output_nr;
  info.storage_nbytes = m.nbytes;
  info.storage_address = m.data_address;
}

}  // namespace

format::ObjectId IdRegistry::StorageId(const c10::TensorImpl& impl, NodeState* pinned_for) {
  if (!impl.has_storage()) return 0;
  const c10::Storage& storage = impl.unsafe_storage();
  c10::StorageImpl* storage_impl = storage.unsafeGetStorageImpl();
  if (storage_impl == nullptr) return 0;
  if (pinned_for == nullptr) return storages_.Lookup(storage_impl, next_id_);
  const format::ObjectId id = storages_.LookupPinned(
      storage_impl, [&] { return storage.getWeakStorageImpl(); }, next_id_);
  pinned_for->pinned_storages.push_back({storage_impl, id});
  return id;
}

format::ObjectId IdRegistry::VersionCounterId(const c10::TensorImpl& impl) {
  const c10::intrusive_ptr_target* counter = VersionCounterOf(impl);
  if (counter == nullptr) return 0;
  bool created = false;
  return counters_.Lookup(counter, [&] { return WeakVersionCounter(impl); }, next_id_, created)
      .id;
}

format::ObjectId IdRegistry::RefTensor(const at::Tensor& tensor, EncodedRecords& out,
                                       format::ObjectId* storage_id,
                                       format::ObjectId* counter_id,
                                       const WrapperInners* inners) {
  if (!tensor.defined()) return 0;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  // The wrapped tensor first: its TensorInfo precedes the wrapper's, and its lookup may move the
  // wrapper's entry. One level: a wrapper inside a wrapper is named, not followed.
  std::optional<format::ObjectId> inner;
  if (inners != nullptr) {
    if (const at::Tensor* t = FindInner(*inners, impl)) inner = RefTensor(*t, out);
  }
  bool created = false;
  auto& entry = tensors_.Lookup(
      impl, [&] { return c10::weak_intrusive_ptr<c10::TensorImpl>(tensor.getIntrusivePtr()); },
      next_id_, created);

  // Most uses of a tensor find its ids and metadata unchanged: compare, build only on change.
  TensorState& state = entry.extra;
  const void* storage_impl = nullptr;
  if (impl->has_storage()) storage_impl = impl->unsafe_storage().unsafeGetStorageImpl();
  const void* counter_impl = VersionCounterOf(*impl);
  const bool known = !created && state.written;
  const format::ObjectId storage = known && storage_impl == state.storage_impl &&
                                           state.storage_generation == storages_.Generation()
                                       ? state.storage
                                       : StorageId(*impl);
  const format::ObjectId counter =
      known && counter_impl == state.counter_impl &&
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
  torch::autograd::Node* grad_fn = torch::autograd::impl::grad_fn_unsafe(tensor);
  const uint64_t grad_fn_generation = nodes_.Generation(grad_fn);  // Find removes nothing.
  format::ObjectId grad_fn_id = 0;
  if (grad_fn != nullptr) {
    grad_fn_id = known && state.grad_fn != 0 && grad_fn == state.grad_fn_node &&
                         state.grad_fn_generation == grad_fn_generation
                     ? state.grad_fn
                     : nodes_.Find(grad_fn);
  }
  state.grad_fn_node = grad_fn;
  state.grad_fn_generation = grad_fn_generation;
  const TensorMetadata metadata = ReadMetadata(tensor, grad_fn == nullptr,
                                               data_addresses_.load(std::memory_order_relaxed));
  uint64_t metadata_hash = 0;
  const bool hashable = HashMetadata(metadata, &metadata_hash);
  const format::ObjectId inner_id = inner.value_or(known ? state.inner : 0);
  if (known && hashable && state.storage == storage && state.version_counter == counter &&
      state.grad_fn == grad_fn_id && state.metadata_hash == metadata_hash &&
      state.inner == inner_id) {
    return entry.id;
  }
  state.written = true;
  state.inner = inner_id;
  state.storage = storage;
  state.version_counter = counter;
  state.grad_fn = grad_fn_id;
  state.metadata_hash = metadata_hash;

  format::TensorInfo& info = tensor_info_;  // Its vectors keep their capacity.
  info.tensor = entry.id;
  info.storage = storage;
  info.version_counter = counter;
  info.grad_fn = grad_fn_id;
  info.inner = inner_id;
  FillTensorInfo(metadata, info);
  out.Add(info);
  return entry.id;
}

void IdRegistry::UnpinSavedStorages(const void* node, format::ObjectId id) {
  auto* entry = nodes_.FindEntry(node);
  if (entry == nullptr || entry->id != id) return;
  for (const NodeState::Pin& pin : entry->extra.pinned_storages) {
    storages_.Unpin(pin.address, pin.id);
  }
  entry->extra.pinned_storages.clear();
}

void IdRegistry::Clear() {
  tensors_.Clear();
  storages_.Clear();
  counters_.Clear();
  nodes_.Clear();
}

}  // namespace torchrr::recorder
