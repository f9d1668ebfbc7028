#include "record_bytes.h"

#include <algorithm>
#include <concepts>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchrr::recorder {
namespace {

using namespace torchrr::format;

// The records with heap members, field by field; every other record, and every element type of
// their vectors except Value, is trivially copyable and travels as its bytes. A field added to one
// of these structs must be added here too: the sizes below stop the build until it is.
static_assert(sizeof(StringDef) == 40 && sizeof(StackDef) == 32 && sizeof(TensorInfo) == 128 &&
                  sizeof(OpRecord) == 144 && sizeof(NodeRecord) == 104 &&
                  sizeof(ErrorRecord) == 80 && sizeof(DataLossRecord) == 64 &&
                  sizeof(Value) == 88,
              "a record changed: update its Fields() in record_bytes.cc, then these sizes");

template <class R, class T>
concept Is = std::same_as<std::remove_const_t<R>, T>;

template <class Io, Is<StringDef> R>
void Fields(Io& io, R& r) {
  io(r.id), io(r.text);
}
template <class Io, Is<StackDef> R>
void Fields(Io& io, R& r) {
  io(r.id), io(r.frames);
}
template <class Io, Is<TensorInfo> R>
void Fields(Io& io, R& r) {
  io(r.tensor), io(r.storage), io(r.version_counter), io(r.dtype), io(r.device), io(r.shape),
      io(r.strides), io(r.storage_offset), io(r.requires_grad), io(r.is_leaf), io(r.grad_fn),
      io(r.output_nr), io(r.storage_nbytes), io(r.storage_address);
}
template <class Io, Is<Value> R>
void Fields(Io& io, R& r) {
  io(r.position), io(r.kind), io(r.i), io(r.d), io(r.d_imag), io(r.s), io(r.ints), io(r.doubles);
}
template <class Io, Is<OpRecord> R>
void Fields(Io& io, R& r) {
  io(r.op), io(r.name), io(r.overload), io(r.parent), io(r.thread), io(r.scope),
      io(r.sequence_nr), io(r.forward_thread), io(r.start_ns), io(r.end_ns), io(r.stack),
      io(r.threw), io(r.grad_mode), io(r.inputs), io(r.outputs), io(r.values);
}
template <class Io, Is<NodeRecord> R>
void Fields(Io& io, R& r) {
  io(r.node), io(r.name), io(r.forward_thread), io(r.sequence_nr), io(r.created_by),
      io(r.variable), io(r.saved_kind), io(r.edges), io(r.saved);
}
template <class Io, Is<ErrorRecord> R>
void Fields(Io& io, R& r) {
  io(r.kind), io(r.op), io(r.thread), io(r.time_ns), io(r.type), io(r.message), io(r.stack);
}
template <class Io, Is<DataLossRecord> R>
void Fields(Io& io, R& r) {
  io(r.records), io(r.bytes), io(r.first_ns), io(r.last_ns), io(r.reason);
}

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

class ByteWriter {
 public:
  explicit ByteWriter(ByteBuffer& out) : out_(out) {}

  template <class T>
  void operator()(const T& value) {
    if constexpr (std::is_trivially_copyable_v<T>) {
      Raw(&value, sizeof(T));
    } else if constexpr (std::is_same_v<T, std::string>) {
      Count(value.size());
      Raw(value.data(), value.size());
    } else {
      static_assert(IsVector<T>::value);
      using Element = typename T::value_type;
      Count(value.size());
      if constexpr (std::is_trivially_copyable_v<Element>) {
        Raw(value.data(), value.size() * sizeof(Element));
      } else {
        for (const Element& element : value) Fields(*this, element);
      }
    }
  }

 private:
  void Count(size_t n) {
    auto n32 = static_cast<uint32_t>(n);
    Raw(&n32, sizeof(n32));
  }
  void Raw(const void* data, size_t n) { out_.Append(data, n); }

  ByteBuffer& out_;
};

class ByteReader {
 public:
  ByteReader(std::string_view bytes, size_t pos) : bytes_(bytes), pos_(pos) {}

  template <class T>
  void operator()(T& value) {
    if constexpr (std::is_trivially_copyable_v<T>) {
      Raw(&value, sizeof(T));
    } else if constexpr (std::is_same_v<T, std::string>) {
      size_t n = Count(1);
      value.assign(bytes_.data() + pos_, n);
      pos_ += n;
    } else {
      static_assert(IsVector<T>::value);
      using Element = typename T::value_type;
      if constexpr (std::is_trivially_copyable_v<Element>) {
        value.resize(Count(sizeof(Element)));
        Raw(value.data(), value.size() * sizeof(Element));
      } else {
        value.resize(Count(1));
        for (Element& element : value) Fields(*this, element);
      }
    }
  }

  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }

 private:
  // A count whose elements (at least `min_bytes` each) fit in what is left; 0 otherwise.
  size_t Count(size_t min_bytes) {
    uint32_t n = 0;
    Raw(&n, sizeof(n));
    if (static_cast<uint64_t>(n) * min_bytes > bytes_.size() - pos_) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  void Raw(void* data, size_t n) {
    if (n > bytes_.size() - pos_) {
      ok_ = false;
      pos_ = bytes_.size();
      std::memset(data, 0, n);
      return;
    }
    std::memcpy(data, bytes_.data() + pos_, n);
    pos_ += n;
  }

  std::string_view bytes_;
  size_t pos_;
  bool ok_ = true;
};

// One record (one of Record's alternatives) through `io`: as its bytes when it has no heap
// members, else field by field.
template <class Io, class R>
void RecordFields(Io& io, R& record) {
  if constexpr (std::is_trivially_copyable_v<std::remove_const_t<R>>) {
    io(record);
  } else {
    Fields(io, record);
  }
}

template <size_t... I>
std::array<Record, kRecordKindCount> EveryAlternative(std::index_sequence<I...>) {
  return {Record(std::in_place_index<I>)...};
}

}  // namespace

void ByteBuffer::Grow(size_t n) {
  size_t capacity = std::max<size_t>({4096, 2 * capacity_, size_ + n});
  auto data = std::make_unique_for_overwrite<char[]>(capacity);
  if (size_ > 0) std::memcpy(data.get(), data_.get(), size_);
  data_ = std::move(data);
  capacity_ = capacity;
}

template <class T, size_t I = 0>
constexpr uint8_t KindOf() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Record>, T>) {
    return I;
  } else {
    return KindOf<T, I + 1>();
  }
}

template <class T>
  requires(!std::is_same_v<T, Record>)
void AppendRecordBytes(const T& record, ByteBuffer& out) {
  constexpr uint8_t kKind = KindOf<T>();
  out.Append(&kKind, 1);
  ByteWriter writer(out);
  RecordFields(writer, record);
}

template void AppendRecordBytes(const StringDef&, ByteBuffer&);
template void AppendRecordBytes(const FrameDef&, ByteBuffer&);
template void AppendRecordBytes(const StackDef&, ByteBuffer&);
template void AppendRecordBytes(const TensorInfo&, ByteBuffer&);
template void AppendRecordBytes(const OpRecord&, ByteBuffer&);
template void AppendRecordBytes(const NodeRecord&, ByteBuffer&);
template void AppendRecordBytes(const NodeExecRecord&, ByteBuffer&);
template void AppendRecordBytes(const ErrorRecord&, ByteBuffer&);
template void AppendRecordBytes(const CudaKernelRecord&, ByteBuffer&);
template void AppendRecordBytes(const CudaMemcpyRecord&, ByteBuffer&);
template void AppendRecordBytes(const DataLossRecord&, ByteBuffer&);
template void AppendRecordBytes(const FingerprintRecord&, ByteBuffer&);
static_assert(kRecordKindCount == 12, "a record kind was added: instantiate it above");

void AppendRecordBytes(const Record& record, ByteBuffer& out) {
  std::visit([&](const auto& r) { AppendRecordBytes(r, out); }, record);
}

RecordBytesReader::RecordBytesReader()
    : scratch_(EveryAlternative(std::make_index_sequence<kRecordKindCount>())) {}

Record* RecordBytesReader::Next(std::string_view bytes, size_t* pos) {
  if (*pos >= bytes.size()) return nullptr;
  auto kind = static_cast<uint8_t>(bytes[*pos]);
  if (kind >= kRecordKindCount) return nullptr;
  Record& record = scratch_[kind];
  ByteReader reader(bytes, *pos + 1);
  std::visit([&](auto& r) { RecordFields(reader, r); }, record);
  if (!reader.ok()) return nullptr;
  *pos = reader.pos();
  return &record;
}

}  // namespace torchrr::recorder
