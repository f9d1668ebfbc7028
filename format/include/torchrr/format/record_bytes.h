// RecordBytes: records as flat bytes, for the hop from the recorder's training threads to its
// writer thread.
//
// A record held as a format::Record owns heap memory (an op's inputs, outputs and arguments, a
// tensor's shape and strides, a node's edges and saved tensors). Queued as such, that memory is
// allocated on the training thread and freed on the writer thread, and glibc then serves every
// allocation on the training thread from its shared arena (the slow path) instead of from the
// thread's own cache. Appended as bytes to the queue instead, each record is freed where it was
// made, right after it is copied, and the queue itself is one growing byte buffer.
//
// This is an in-process encoding, not a file format: both ends are the same build. The trace file
// format is SPEC.md's; the writer thread decodes these bytes back into records for it.
//
// Layout: a record is its kind (Record's alternative index, one byte), then the record: a struct
// that is trivially copyable as its bytes, any other field by field (record_fields.h), a string or
// vector as a 32-bit count and its elements.
#ifndef TORCHRR_FORMAT_RECORD_BYTES_H_
#define TORCHRR_FORMAT_RECORD_BYTES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "torchrr/format/record_fields.h"
#include "torchrr/format/records.h"

namespace torchrr::format {

// A growable byte buffer whose appends inline to a bounds check and a memcpy (std::string's append
// is an out-of-line call per field). Not thread-safe.
class ByteBuffer {
 public:
  void Append(const void* bytes, size_t n) {
    if (n > capacity_ - size_) Grow(n);
    std::memcpy(data_.get() + size_, bytes, n);
    size_ += n;
  }
  void clear() { size_ = 0; }  // Keeps the capacity.
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  std::string_view view() const { return {data_.get(), size_}; }
  void swap(ByteBuffer& other) {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
  }

 private:
  void Grow(size_t n);

  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Appends `record` to `out`. Allocates only when `out` grows. The template takes each of Record's
// alternatives as itself (no variant is built) and inlines into the caller.
void AppendRecordBytes(const Record& record, ByteBuffer& out);
template <class T>
  requires(!std::is_same_v<T, Record>)
void AppendRecordBytes(const T& record, ByteBuffer& out);

// Records appended as bytes as they are made, and how many: the recorder's callbacks build each
// record once (in storage they reuse) and copy it here, so a group of records costs no allocation
// once the buffer has grown. Not thread-safe.
class EncodedRecords {
 public:
  template <class T>
  void Add(const T& record) {
    AppendRecordBytes(record, bytes_);
    ++count_;
  }
  void AddAll(const EncodedRecords& other) {
    bytes_.Append(other.bytes_.view().data(), other.bytes_.size());
    count_ += other.count_;
  }
  void clear() {
    bytes_.clear();
    count_ = 0;
  }
  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  std::string_view bytes() const { return bytes_.view(); }

 private:
  ByteBuffer bytes_;
  size_t count_ = 0;
};

// Decodes records from bytes written by AppendRecordBytes, one at a time, into per-kind scratch
// records whose vectors and strings keep their capacity between records.
class RecordBytesReader {
 public:
  RecordBytesReader();

  // Decodes the record at `*pos` in `bytes`, advances `*pos` past it and returns it; the reference
  // stays valid (and may be modified) until the next call. Returns nullptr at the end, or when
  // the bytes are cut or not AppendRecordBytes' (a bug: both ends are this build).
  Record* Next(std::string_view bytes, size_t* pos);

 private:
  std::array<Record, kRecordKindCount> scratch_;
};

namespace internal {

// Passes every member of `s` to `io` (ByteWriter or ByteReader), in declaration order.
template <class Io, class S>
void Fields(Io& io, S& s) {
  ForEachField(s, [&io](const auto&, auto& value) { io(value); });
}

// A record through `io`: as its bytes when it has no heap members, else field by field.
template <class Io, class R>
void RecordFields(Io& io, R& record) {
  if constexpr (std::is_trivially_copyable_v<std::remove_const_t<R>>) {
    io(record);
  } else {
    Fields(io, record);
  }
}

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
    } else if constexpr (HasFields<T>) {
      Fields(*this, value);
    } else {
      static_assert(IsVector<T>::value, "a field of a type RecordBytes does not know");
      using Element = typename T::value_type;
      Count(value.size());
      if constexpr (std::is_trivially_copyable_v<Element>) {
        Raw(value.data(), value.size() * sizeof(Element));
      } else {
        for (const Element& element : value) (*this)(element);
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

template <class T, size_t kIndex = 0>
constexpr uint8_t KindOf() {
  if constexpr (std::is_same_v<std::variant_alternative_t<kIndex, Record>, T>) {
    return kIndex;
  } else {
    return KindOf<T, kIndex + 1>();
  }
}

}  // namespace internal

template <class T>
  requires(!std::is_same_v<T, Record>)
void AppendRecordBytes(const T& record, ByteBuffer& out) {
  constexpr uint8_t kKind = internal::KindOf<T>();
  out.Append(&kKind, 1);
  internal::ByteWriter writer(out);
  internal::RecordFields(writer, record);
}

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_RECORD_BYTES_H_
