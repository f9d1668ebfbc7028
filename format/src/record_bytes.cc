#include "torchrr/format/record_bytes.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchrr::format {
namespace {

// ByteWriter's inverse. Never reads past the end: a cut or foreign record sets !ok().
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
    } else if constexpr (HasFields<T>) {
      internal::Fields(*this, value);
    } else {
      static_assert(IsVector<T>::value, "a field of a type RecordBytes does not know");
      using Element = typename T::value_type;
      if constexpr (std::is_trivially_copyable_v<Element>) {
        value.resize(Count(sizeof(Element)));
        Raw(value.data(), value.size() * sizeof(Element));
      } else {
        value.resize(Count(1));
        for (Element& element : value) (*this)(element);
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
  std::visit([&](auto& r) { internal::RecordFields(reader, r); }, record);
  if (!reader.ok()) return nullptr;
  *pos = reader.pos();
  return &record;
}

}  // namespace torchrr::format
