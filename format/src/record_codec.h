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

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "torchrr/format/reader.h"
#include "torchrr/format/record_fields.h"
#include "torchrr/format/records.h"
#include "torchrr/format/status.h"
#include "torchrr/format/step_rule.h"
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
    const uint64_t z = Zigzag(static_cast<uint64_t>(t) - static_cast<uint64_t>(cursor_));
    cursor_ = t;
    return z;
  }
  int64_t Decode(uint64_t z) {
    cursor_ = static_cast<int64_t>(static_cast<uint64_t>(cursor_) + Unzigzag(z));
    return cursor_;
  }
  int64_t cursor() const { return cursor_; }
  void MoveTo(int64_t t) { cursor_ = t; }

  // A wrapped difference as zigzag (small of either sign, small), and back.
  static uint64_t Zigzag(uint64_t delta) {
    return (delta << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(delta) >> 63);
  }
  static uint64_t Unzigzag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

 private:
  int64_t cursor_;
};

// How a RecordBatch codes its records (its `coding`, SPEC.md "Step coding").
enum class BatchCoding : uint8_t {
  kCursors = 0,  // Formats 1.0 to 1.9: ids and times against the cursors, in the tables.
  kSteps = 1,    // 1.10: also times in the batch's time column, sequence numbers and versions as
                 // deltas, so that a repeating step repeats byte for byte.
  kStepsRecent = 2,  // 1.11: kSteps, and ids used recently as how many id uses ago (RecentIds).
  kStepsRecentByKind = 3,  // 1.13: kStepsRecent, the uses counted among those of the id's kind.
  kStepsExecTimes = 4,     // 1.14: kStepsRecentByKind, and a node execution's times from its op's.
  kStepsPredictedTimes = 5,  // 1.15: kStepsExecTimes, op times from the previous steps' (below).
};

// The ids of a kStepsRecent batch used recently, by how many id uses ago. A training step refers
// to its activations, nodes and views in the same pattern step after step while their ids shift
// with every allocation that differs between steps (a storage id given again by address): the
// distance in uses repeats where the distance from `high` does not. In a kStepsRecentByKind
// batch the uses of each IdKind are counted apart (`kind`: the IdKind, else 0): how many ids of
// other kinds come between two uses of a tensor varies from step to step more than how many
// tensors do.
class RecentIds {
 public:
  static constexpr uint64_t kWindow = uint64_t{1} << 16;
  // The encoder's table of last uses: ids kSets apart share a set of kWays slots (below).
  static constexpr uint64_t kSets = uint64_t{1} << 16;
  static constexpr uint64_t kWays = 2;

  // Encoding: how many uses of its kind ago x was last used (1: the use just before), 0 when not
  // within kWindow, last used as another kind, or no longer in the table. Then notes this use,
  // which Undo takes back.
  uint64_t Ago(ObjectId x, size_t kind = 0) {
    if (last_.empty()) last_.resize(kSlots);
    // The id's set: two slots side by side. A slot not of this batch, else the one used longer
    // ago, gives way to an id in neither.
    uint32_t index = static_cast<uint32_t>((x & (kSets - 1)) * kWays);
    Slot* slot = &last_[index];
    uint64_t previous = 0;  // The use's clock + 1, times kKinds, plus its kind.
    if (Holds(slot[0], x)) {
      previous = slot[0].last;
    } else if (Holds(slot[1], x)) {
      previous = slot[1].last;
      ++index;
    } else if (slot[0].batch == batch_ &&
               (slot[1].batch != batch_ || slot[1].last < slot[0].last)) {
      ++index;
    }
    Slot& use = last_[index];
    undo_.push_back(Change{use, index, kind});
    const uint64_t now = ++clock_[kind];
    const uint64_t value = now * kKinds + kind;
    // A batch of more than 2^32 / kKinds uses (none has): its later ids are coded in full.
    use = value <= UINT32_MAX ? Slot{x, batch_, static_cast<uint32_t>(value)} : Slot{};
    if (previous == 0 || previous % kKinds != kind) return 0;
    const uint64_t ago = now - previous / kKinds;
    return ago <= kWindow ? ago : 0;
  }
  // Decoding: the id of this kind used `ago` uses of it ago, 0 when there is none.
  ObjectId At(uint64_t ago, size_t kind = 0) const {
    const uint64_t clock = clock_[kind];
    return ago == 0 || ago > kWindow || ago > clock ? 0 : ring_[kind][(clock - ago) % kWindow];
  }
  // Decoding: notes a use of x. The ring grows with the uses up to kWindow entries, so that a
  // small batch (a flush, a spill) does not allocate the whole window.
  void Use(ObjectId x, size_t kind = 0) {
    std::vector<ObjectId>& ring = ring_[kind];
    if (ring.size() < kWindow) {
      ring.push_back(x);
    } else {
      ring[clock_[kind] % kWindow] = x;
    }
    ++clock_[kind];
  }
  // Encoding: the uses noted since the last Commit are taken back (a dropped record's).
  void Undo() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
      last_[it->index] = it->slot;
      --clock_[it->kind];
    }
    undo_.clear();
  }
  void Commit() { undo_.clear(); }
  void Clear() {
    undo_.clear();
    clock_.fill(0);
    if (++batch_ == 0) {  // The batch number wrapped: no slot may look current.
      std::fill(last_.begin(), last_.end(), Slot{});
      batch_ = 1;
    }
  }

 private:
  static constexpr uint64_t kKinds = kIdKinds;
  // Ids are handed out in order, so the ids a batch uses are mostly a run of recent ones: a table
  // indexed by the id's low bits keeps them apart and next to each other, where a hash table
  // scatters them and allocates a node each. An id that loses its slot to another of its set is
  // coded in full at its next use (Ago 0), which the decoder reads all the same. Two ways keep an
  // id used every step (a parameter's) from losing its slot to each new id.
  static constexpr uint64_t kSlots = kSets * kWays;
  static_assert(kWays == 2, "Ago() looks in two slots");
  struct Slot {
    ObjectId id = 0;
    uint32_t batch = 0;  // The slot holds a use in the batch of this number (batch_).
    uint32_t last = 0;   // That use's clock + 1, times kKinds, plus the kind it was used as.
  };
  struct Change {
    Slot slot;  // As it was.
    uint32_t index;
    size_t kind;
  };
  bool Holds(const Slot& slot, ObjectId x) const { return slot.id == x && slot.batch == batch_; }

  // Encoding, allocated at the first use: the last use of the id in each slot. One table for
  // every kind: an id names one object, of one kind.
  std::vector<Slot> last_;
  uint32_t batch_ = 1;
  std::vector<Change> undo_;                               // Encoding: the record's changes.
  std::array<std::vector<ObjectId>, kIdKinds> ring_;       // Decoding: each kind's last uses.
  std::array<uint64_t, kIdKinds> clock_{};                 // Uses so far, per kind.
};

// Sequence numbers (OpRecord's, NodeRecord's) in kSteps batches: -1 (none) is stored as -1 (the
// default, not stored), any other value as the zigzag delta from the cursor, which starts at 0 in
// each batch and moves to each value stored: the ops of a step number their nodes one after the
// other, so the deltas repeat step after step.
class SequenceCoder {
 public:
  // False (nothing changed) for the one value whose delta codes as -1: 2^63 away from the cursor.
  bool Encode(int64_t s, int64_t* stored) {
    if (s == -1) {
      *stored = -1;
      return true;
    }
    uint64_t delta = static_cast<uint64_t>(s) - static_cast<uint64_t>(cursor_);
    uint64_t z = (delta << 1) ^ (static_cast<uint64_t>(static_cast<int64_t>(delta) >> 63));
    if (z == ~uint64_t{0}) return false;
    cursor_ = s;
    *stored = static_cast<int64_t>(z);
    return true;
  }
  int64_t Decode(int64_t stored) {
    if (stored == -1) return -1;
    auto z = static_cast<uint64_t>(stored);
    uint64_t delta = (z >> 1) ^ (~(z & 1) + 1);
    cursor_ = static_cast<int64_t>(static_cast<uint64_t>(cursor_) + delta);
    return cursor_;
  }

 private:
  int64_t cursor_ = 0;
};

// What a kSteps batch codes beyond the cursors: the time column (each time field's zigzag delta
// as a LEB128 varint, in field order), the sequence cursor, and ids against the previous step:
// the k-th id field of a step (StepRule's, from the batch's start) that is not 0 and equals the
// k-th of the step before is stored as kSameAsPreviousStep. Parameters, optimizer state and
// storages at reused addresses keep their ids from step to step, where their distance from
// `high`, which the cursor coding stores, grows.
struct StepCoding {
  // Tag 0 with payload 1, which no kCursors batch stores.
  static constexpr uint64_t kSameAsPreviousStep = 4;

  std::vector<uint8_t> times;  // Encoding: appended to; decoding: unused.
  SequenceCoder sequence;
  StepRule steps;
  std::vector<ObjectId> previous_step_ids;
  std::vector<ObjectId> step_ids;

  bool recent_ids = false;      // A kStepsRecent batch or later.
  bool recent_by_kind = false;  // kStepsRecentByKind or later: each IdKind's uses counted apart.
  RecentIds recent;
  // kStepsExecTimes: a NodeExecRecord's start_ns and end_ns are coded as differences from the
  // start_ns and end_ns of the last OpRecord before it in the batch (op_times; 0 before the
  // first), not from the time cursor: the recorder writes a node's execution right after the op
  // that ran it, with the same times, so both code as 0. The cursor still moves to each time.
  bool exec_times_from_op = false;
  int64_t op_times[2] = {0, 0};

  // kStepsPredictedTimes: the k-th op time of a step (an OpRecord's start_ns or end_ns), whose
  // difference d from the cursor 1.14 stores as zigzag(d), is stored as zigzag(d - p): p is the
  // least of the k-th op time differences of the two steps before it in the batch whose k-th op
  // time is of an op of the same name, or 0 when neither's is. A training step runs the same ops
  // for about as long step after step, so d - p keeps the jitter only: the floor of a time's
  // recent values guesses better than the last value, which carries jitter of its own. The name
  // keeps a step that differs (the first, an evaluation) from guessing from ops it does not run.
  // Node executions' times, which 1.14 already stores as 0, are left as they are.
  //
  // The k-th op times of the last two steps are kept in place, in one array the coding walks once
  // a step.
  struct TimeSlot {
    // [0]: the difference of the last step that had a k-th op time, and its op's name; [1]: of
    // the step that had one before it.
    InternId name[2] = {0, 0};
    int64_t delta[2] = {0, 0};
  };
  bool times_from_steps = false;
  InternId op_name = 0;  // The name of the OpRecord being coded.
  std::vector<TimeSlot> time_slots;
  size_t op_time = 0;                  // This step's op times so far: the next one's k.
  size_t step_op_times[2] = {0, 0};    // How many the last step had, and the one before it.

  // Which time of which record a time field is (TimeRoleOf).
  enum class TimeRole : uint8_t { kOther, kOpStart, kOpEnd, kExecStart, kExecEnd };
  uint64_t EncodeTime(TimeCoder& times, int64_t t, TimeRole role) {
    const auto from = static_cast<uint64_t>(From(times, role));
    times.MoveTo(t);
    const uint64_t delta = static_cast<uint64_t>(t) - from;
    if (role != TimeRole::kOpStart && role != TimeRole::kOpEnd) return TimeCoder::Zigzag(delta);
    op_times[role == TimeRole::kOpEnd] = t;
    return TimeCoder::Zigzag(times_from_steps ? delta - Predicted(delta) : delta);
  }
  int64_t DecodeTime(TimeCoder& times, uint64_t z, TimeRole role) {
    const auto from = static_cast<uint64_t>(From(times, role));
    uint64_t delta = TimeCoder::Unzigzag(z);
    const bool op_time = role == TimeRole::kOpStart || role == TimeRole::kOpEnd;
    if (op_time && times_from_steps) delta += Predicted(delta, true);
    const auto t = static_cast<int64_t>(from + delta);
    times.MoveTo(t);
    if (op_time) op_times[role == TimeRole::kOpEnd] = t;
    return t;
  }

  // What a time field's difference is taken from: its op's time or the cursor (1.14).
  int64_t From(const TimeCoder& times, TimeRole role) const {
    if (exec_times_from_op && (role == TimeRole::kExecStart || role == TimeRole::kExecEnd)) {
      return op_times[role == TimeRole::kExecEnd];
    }
    return times.cursor();
  }
  // kStepsPredictedTimes: the k-th op time's p. Notes this time's difference: `value` itself when
  // encoding, or when decoding (`residual`) value + p.
  uint64_t Predicted(uint64_t value, bool residual = false) {
    const size_t k = op_time++;
    if (k == time_slots.size()) time_slots.emplace_back();
    TimeSlot& slot = time_slots[k];
    // Where the last step had a k-th op time, [0] is its and [1] is the step's before, if that
    // one had a k-th too; where only the step before had one, [0] is its.
    const bool last = k < step_op_times[0];
    const bool before = k < step_op_times[1];
    // Without branches: which of the two is less is noise, a branch on it mispredicted half the
    // time.
    const bool use0 = (last | before) & (slot.name[0] == op_name);
    const bool use1 = last & before & (slot.name[1] == op_name);
    const int64_t d0 = slot.delta[0];
    const int64_t d1 = slot.delta[1];
    const int64_t least = std::min(d0, d1);
    const int64_t p = use0 ? (use1 ? least : d0) : (use1 ? d1 : 0);
    const auto predicted = static_cast<uint64_t>(p);
    slot.name[1] = slot.name[0];
    slot.delta[1] = slot.delta[0];
    slot.name[0] = op_name;
    slot.delta[0] = static_cast<int64_t>(residual ? value + predicted : value);
    return predicted;
  }

  // Encoding: what a record changes of the op names and times, for a dropped record to take back
  // (an OpRecord has two op times).
  struct TimesMark {
    InternId op_name = 0;
    size_t op_time = 0;
    size_t slots = 0;
    TimeSlot saved[2];
  };
  TimesMark MarkTimes() const {
    TimesMark mark{op_name, op_time, time_slots.size(), {}};
    for (size_t i = 0; i < 2 && op_time + i < time_slots.size(); ++i) {
      mark.saved[i] = time_slots[op_time + i];
    }
    return mark;
  }
  void RestoreTimes(const TimesMark& mark) {
    time_slots.resize(mark.slots);
    for (size_t i = 0; i < 2 && mark.op_time + i < mark.slots; ++i) {
      time_slots[mark.op_time + i] = mark.saved[i];
    }
    op_time = mark.op_time;
    op_name = mark.op_name;
  }

  // The kind RecentIds counts an id of this kind among.
  size_t RecentKind(IdKind kind) const { return recent_by_kind ? static_cast<size_t>(kind) : 0; }

  uint64_t EncodeId(IdCoder& ids, ObjectId x, IdKind kind) {
    const size_t k = step_ids.size();
    step_ids.push_back(x);
    const uint64_t ago = recent_ids && x != 0 ? recent.Ago(x, RecentKind(kind)) : 0;
    if (x != 0 && k < previous_step_ids.size() && previous_step_ids[k] == x) {
      return kSameAsPreviousStep;
    }
    // Tag 0 with a payload of 2 or more: used `payload - 1` uses ago. Only for an id at or below
    // `high`, whose coding then leaves `high` as it is.
    if (ago != 0 && x <= ids.high()) return (ago + 1) << 2;
    return ids.Encode(x);
  }
  ObjectId DecodeId(IdCoder& ids, uint64_t v, IdKind kind) {
    const size_t k = step_ids.size();
    ObjectId x;
    if (v == kSameAsPreviousStep) {
      x = k < previous_step_ids.size() ? previous_step_ids[k] : 0;
    } else if (recent_ids && (v & 3) == 0 && (v >> 2) >= 2) {
      x = recent.At((v >> 2) - 1, RecentKind(kind));
    } else {
      x = ids.Decode(v);
    }
    if (recent_ids && x != 0) recent.Use(x, RecentKind(kind));
    step_ids.push_back(x);
    return x;
  }
  // The flags of a step-coded batch of `coding`.
  void SetCoding(BatchCoding coding) {
    recent_ids = coding >= BatchCoding::kStepsRecent;
    recent_by_kind = coding >= BatchCoding::kStepsRecentByKind;
    exec_times_from_op = coding >= BatchCoding::kStepsExecTimes;
    times_from_steps = coding >= BatchCoding::kStepsPredictedTimes;
    op_times[0] = op_times[1] = 0;
    op_name = 0;
    time_slots.clear();
    op_time = 0;
    step_op_times[0] = step_op_times[1] = 0;
  }

  // After each record, encoded or decoded.
  void Next(const Record& record) {
    if (steps.Add(record)) BeginStep();
  }
  // The next record begins a step: this one's ids and times become the previous step's.
  void BeginStep() {
    previous_step_ids.swap(step_ids);
    step_ids.clear();
    step_op_times[1] = step_op_times[0];
    step_op_times[0] = op_time;
    op_time = 0;
  }

  // Decoding: the batch's column, read from `pos`; `short_column` once it ran out (the times
  // after decode as the cursor itself).
  const uint8_t* column = nullptr;
  size_t column_size = 0;
  size_t pos = 0;
  bool short_column = false;

  void PutTime(uint64_t z) {
    while (z >= 0x80) {
      times.push_back(static_cast<uint8_t>(z | 0x80));
      z >>= 7;
    }
    times.push_back(static_cast<uint8_t>(z));
  }
  uint64_t NextTime() {
    uint64_t z = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= column_size) break;
      uint8_t b = column[pos++];
      z |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return z;
    }
    short_column = true;
    return 0;
  }
};

// Builds one RecordBatch. Reused from batch to batch (keeps its buffers).
class BatchEncoder {
 public:
  BatchEncoder(size_t initial_bytes, BatchCoding coding);

  // Starts a batch whose cursors begin at base_high / base_time_ns.
  void Reset(uint64_t base_high, int64_t base_time_ns);
  // Encodes one record. kInvalidArgument (record dropped, encoder unchanged otherwise) for an id
  // above kMaxObjectId, or, in a kSteps batch, a sequence number 2^63 from the one before.
  Status Add(const Record& record);
  // Ends the batch; the bytes stay valid until the next Reset.
  std::span<uint8_t> Finish();

  size_t records() const { return types_.size(); }
  // Bytes the batch would have if finished now (within a few bytes).
  size_t raw_size() const {
    return fbb_.GetSize() + types_.size() * 5 + steps_.times.size() + 64;
  }
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
  BatchCoding coding_;
  StepCoding steps_;  // kSteps only.
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
  // A kSteps batch whose time column is shorter or longer than its time fields, or a coding this
  // reader does not know (no record is then decoded): the batch is corrupt.
  bool bad_coding = false;
  uint64_t end_high = 0;
  int64_t end_time_ns = 0;
};

// Decodes a verified RecordBatch, calling `emit` for each record of a known kind in order.
template <typename Emit>
DecodedBatch DecodeBatch(const fb::RecordBatch& batch, Emit&& emit);

// The `records` vector of a RecordBatch chunk flagged kChunkFlagOffsetDeltas (1.12, SPEC.md
// "Chunk"): each element after the first stored as the element before minus itself, mod 2^32.
// An element is the distance from itself to its record's table, which changes with every record
// of the batch; the difference is the size of the record before plus 4, which repeats step after
// step, so zstd removes it where it cannot remove the distances. Rewrites a finished
// RecordBatch in place, to the differences (to_deltas) or back. False, with nothing changed, when
// `batch` has no records vector within its bytes where its root table says: to read, the chunk is
// corrupt; a batch that is not yet verified is only read within its bounds.
bool RecordOffsetDeltas(std::span<uint8_t> batch, bool to_deltas);

// Verifies a payload of the given chunk type. Bounded work: depth 64, one table per 4 bytes.
bool VerifyPayload(uint16_t chunk_type, const uint8_t* data, size_t size);

void EncodeFileInfo(const FileInfo& info, flatbuffers::FlatBufferBuilder& fbb);
FileInfo DecodeFileInfo(const fb::FileInfo& info);
void EncodeIndex(const std::vector<ChunkInfo>& chunks, flatbuffers::FlatBufferBuilder& fbb);

// Decodes one record; false for an unknown type. `steps`: nullptr in a kCursors batch.
bool DecodeRecord(fb::Record type, const void* table, IdCoder& ids, TimeCoder& times,
                  StepCoding* steps, Record& out);

template <typename Emit>
DecodedBatch DecodeBatch(const fb::RecordBatch& batch, Emit&& emit) {
  IdCoder ids(batch.base_high());
  TimeCoder times(batch.base_time_ns());
  DecodedBatch decoded;
  const auto coding = static_cast<BatchCoding>(batch.coding());
  StepCoding steps;
  const bool step_coded =
      coding != BatchCoding::kCursors && coding <= BatchCoding::kStepsPredictedTimes;
  steps.SetCoding(coding);
  if (step_coded && batch.times() != nullptr) {
    steps.column = batch.times()->data();
    steps.column_size = batch.times()->size();
  }
  const auto* types = batch.records_type();
  const auto* tables = batch.records();
  if (coding != BatchCoding::kCursors && !step_coded) {
    decoded.bad_coding = true;
  } else if (types != nullptr && tables != nullptr) {
    StepCoding* step_coding = step_coded ? &steps : nullptr;
    Record record;
    for (flatbuffers::uoffset_t i = 0; i < tables->size(); ++i) {
      if (DecodeRecord(static_cast<fb::Record>(types->Get(i)), tables->Get(i), ids, times,
                       step_coding, record)) {
        if (step_coding != nullptr) step_coding->Next(record);
        emit(record);
      } else {
        ++decoded.unknown;
      }
    }
  }
  // Unknown records may hold times of their own: the column's length then says nothing.
  if (step_coded && decoded.unknown == 0 &&
      (steps.short_column || steps.pos != steps.column_size)) {
    decoded.bad_coding = true;
  }
  decoded.end_high = ids.high();
  decoded.end_time_ns = times.cursor();
  return decoded;
}

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_SRC_RECORD_CODEC_H_
