// Record <-> FlatBuffers, with the id and time coding of SPEC.md ("Id and time coding").
//
// Ids are coded against a running `high` (the largest id seen so far in the batch, starting at the
// batch's base_high) and timestamps as zigzag deltas from a running cursor (starting at
// base_time_ns), so that a training step that repeats its allocations in the same order gives the
// same coded values step after step, which zstd then removes. The encoder and the decoder walk
// every record's fields in the same order, the order they are declared in records.h, from the
// lists of record_fields.h, which say which fields are ids and times.
// Internal to format/.
#ifndef TORCHRR_FORMAT_SRC_RECORD_CODEC_H_
#define TORCHRR_FORMAT_SRC_RECORD_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "torchrr/format/reader.h"
#include "torchrr/format/records.h"
#include "torchrr/format/status.h"
#include "trace_generated.h"

namespace torchrr::format {

// Ids at or above 2^62 cannot be coded (the two low bits of a coded id are its tag).
inline constexpr uint64_t kMaxObjectId = (uint64_t{1} << 62) - 1;

class IdCoder {
 public:
  explicit IdCoder(uint64_t base_high = 0) : base_(base_high), high_(base_high) {}

  // 0 -> 0; above high: (x - high) << 2 | 1, and high = x; in (base, high]: (high - x) << 2 | 2;
  // at or below base: x << 2 | 3. Sets overflow() for an id above kMaxObjectId.
  uint64_t Encode(ObjectId x) {
    if (x == 0) return 0;
    overflow_ |= x > kMaxObjectId;
    if (x > high_) {
      uint64_t delta = x - high_;
      high_ = x;
      return (delta << 2) | 1;
    }
    if (x > base_) return ((high_ - x) << 2) | 2;
    return (x << 2) | 3;
  }
  // Inverse of Encode for the same sequence. Any input decodes to some id (tag 0 with a payload,
  // which no writer produces, decodes to 0).
  ObjectId Decode(uint64_t v) {
    switch (v & 3) {
      case 1:
        high_ += v >> 2;
        return high_;
      case 2:
        return high_ - (v >> 2);
      case 3:
        return v >> 2;
      default:
        return 0;
    }
  }
  uint64_t high() const { return high_; }
  bool overflow() const { return overflow_; }

 private:
  uint64_t base_;
  uint64_t high_;
  bool overflow_ = false;
};

class TimeCoder {
 public:
  explicit TimeCoder(int64_t base = 0) : cursor_(base) {}
  // Zigzag delta from the cursor (wrapping, so every int64 round-trips); the cursor moves to t.
  uint64_t Encode(int64_t t) {
    auto delta = static_cast<int64_t>(static_cast<uint64_t>(t) - static_cast<uint64_t>(cursor_));
    cursor_ = t;
    return (static_cast<uint64_t>(delta) << 1) ^ static_cast<uint64_t>(delta >> 63);
  }
  int64_t Decode(uint64_t z) {
    uint64_t delta = (z >> 1) ^ (~(z & 1) + 1);
    cursor_ = static_cast<int64_t>(static_cast<uint64_t>(cursor_) + delta);
    return cursor_;
  }
  int64_t cursor() const { return cursor_; }

 private:
  int64_t cursor_;
};

// Builds one RecordBatch. Reused from batch to batch (keeps its buffers).
class BatchEncoder {
 public:
  explicit BatchEncoder(size_t initial_bytes);

  // Starts a batch whose cursors begin at base_high / base_time_ns.
  void Reset(uint64_t base_high, int64_t base_time_ns);
  // Encodes one record. kInvalidArgument (record dropped, encoder unchanged otherwise) for an id
  // above kMaxObjectId.
  Status Add(const Record& record);
  // Ends the batch; the bytes stay valid until the next Reset.
  std::span<const uint8_t> Finish();

  size_t records() const { return types_.size(); }
  // Bytes the batch would have if finished now (within a few bytes).
  size_t raw_size() const { return fbb_.GetSize() + types_.size() * 5 + 64; }
  uint64_t high() const { return ids_.high(); }
  int64_t time_cursor() const { return times_.cursor(); }

 private:
  flatbuffers::FlatBufferBuilder fbb_;
  std::vector<uint8_t> types_;
  std::vector<flatbuffers::Offset<void>> offsets_;
  std::vector<flatbuffers::Offset<void>> table_offsets_;  // Scratch: a vector of tables' offsets.
  uint64_t base_high_ = 0;
  int64_t base_time_ns_ = 0;
  IdCoder ids_;
  TimeCoder times_;
};

// The strings and vectors of a record (or FileInfo), nested ones included: how many elements they
// hold (characters, numbers, structs, tables), and an upper bound (roughly) of the bytes the
// record takes encoded, to keep chunks under kMaxChunkBytes.
struct EncodedSize {
  size_t elements = 0;
  size_t bytes = 0;
};
EncodedSize EstimateEncodedSize(const Record& record);
EncodedSize EstimateEncodedSize(const FileInfo& info);

// What decoding a batch found: the records of unknown kinds (a newer minor version's), which are
// skipped, and where the cursors ended, which is where the next batch the writer wrote starts
// (its base_high and base_time_ns) unless unknown records moved them.
struct DecodedBatch {
  size_t unknown = 0;
  uint64_t end_high = 0;
  int64_t end_time_ns = 0;
};

// Decodes a verified RecordBatch, calling `emit` for each record of a known kind in order.
template <typename Emit>
DecodedBatch DecodeBatch(const fb::RecordBatch& batch, Emit&& emit);

// Verifies a payload of the given chunk type. Bounded work: depth 64, one table per 4 bytes.
bool VerifyPayload(uint16_t chunk_type, const uint8_t* data, size_t size);

void EncodeFileInfo(const FileInfo& info, flatbuffers::FlatBufferBuilder& fbb);
FileInfo DecodeFileInfo(const fb::FileInfo& info);
void EncodeIndex(const std::vector<ChunkInfo>& chunks, flatbuffers::FlatBufferBuilder& fbb);

// Decodes one record; false for an unknown type.
bool DecodeRecord(fb::Record type, const void* table, IdCoder& ids, TimeCoder& times, Record& out);

template <typename Emit>
DecodedBatch DecodeBatch(const fb::RecordBatch& batch, Emit&& emit) {
  IdCoder ids(batch.base_high());
  TimeCoder times(batch.base_time_ns());
  DecodedBatch decoded;
  const auto* types = batch.records_type();
  const auto* tables = batch.records();
  if (types != nullptr && tables != nullptr) {
    Record record;
    for (flatbuffers::uoffset_t i = 0; i < tables->size(); ++i) {
      if (DecodeRecord(static_cast<fb::Record>(types->Get(i)), tables->Get(i), ids, times,
                       record)) {
        emit(record);
      } else {
        ++decoded.unknown;
      }
    }
  }
  decoded.end_high = ids.high();
  decoded.end_time_ns = times.cursor();
  return decoded;
}

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_SRC_RECORD_CODEC_H_
