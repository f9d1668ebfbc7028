// The trace format: round trips, codec branches, step coding, json. A trace file's writer and
// reader (errors, cuts, flips, pieces): file_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "container.h"
#include "record_codec.h"
#include "sample_records.h"
#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/record_fields.h"
#include "torchrr/format/step_rule.h"
#include "torchrr/format/writer.h"
#include "trace_test_helpers.h"

namespace torchrr::format {
namespace {

using testing::EveryKind;
using testing::ExpectSameRecords;
using testing::ManySteps;
using testing::SampleFileInfo;
using testing::TrainingSteps;
using testing::Write;


TEST(IdCoder, EveryBranchRoundTrips) {
  const uint64_t base = 100;
  std::vector<ObjectId> ids = {0, 150, 150, 149, 101, 100, 1, 0, 151, 1000, 500, kMaxObjectId, 7,
                               kMaxObjectId - 1, 101};
  IdCoder encoder(base);
  std::vector<uint64_t> coded;
  for (ObjectId id : ids) coded.push_back(encoder.Encode(id));
  EXPECT_FALSE(encoder.overflow());
  EXPECT_EQ(coded[0], 0u);
  EXPECT_EQ(coded[1], (50u << 2) | 1);   // New: distance above high.
  EXPECT_EQ(coded[2], (0u << 2) | 2);    // Seen: distance below high.
  EXPECT_EQ(coded[3], (1u << 2) | 2);
  EXPECT_EQ(coded[5], (100u << 2) | 3);  // At or below base: absolute.
  EXPECT_EQ(coded[6], (1u << 2) | 3);
  IdCoder decoder(base);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(decoder.Decode(coded[i]), ids[i]) << i;

  IdCoder overflowing(0);
  overflowing.Encode(kMaxObjectId + 1);
  EXPECT_TRUE(overflowing.overflow());
}

TEST(TimeCoder, ExtremesRoundTrip) {
  std::vector<int64_t> times = {0, 5, 3, INT64_MAX, INT64_MIN, -1, 1, INT64_MIN, INT64_MAX, 0};
  TimeCoder encoder(17);
  TimeCoder decoder(17);
  for (int64_t t : times) EXPECT_EQ(decoder.Decode(encoder.Encode(t)), t);
  TimeCoder small(1000);
  EXPECT_EQ(small.Encode(1003), 6u);  // zigzag(+3)
  EXPECT_EQ(small.Encode(1002), 1u);  // zigzag(-1)
}

TEST(RoundTrip, EveryKindEveryField) {
  std::vector<Record> records = EveryKind(1000, 7, 5'000'000'000);
  ASSERT_EQ(records.size(), kRecordKindCount);
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(records[i].index(), i);
  Trace trace = ReadTraceBytesAll(Write(records));
  EXPECT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  EXPECT_TRUE(trace.summary.has_index);
  ExpectSameRecords(records, trace.records);
  for (size_t i = 0; i < kRecordKindCount; ++i) EXPECT_EQ(trace.summary.records_per_kind[i], 1u);
  ASSERT_TRUE(trace.summary.has_info);
  EXPECT_EQ(trace.summary.info, SampleFileInfo());
  EXPECT_EQ(trace.summary.header.major, kFormatMajor);
  EXPECT_EQ(trace.summary.header.minor, kFormatMinor);
}

TEST(RoundTrip, ManyChunksCarryTheCursors) {
  std::vector<Record> records = ManySteps(40);
  std::string bytes = Write(records, 600);
  Trace trace = ReadTraceBytesAll(bytes);
  EXPECT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  EXPECT_TRUE(trace.summary.has_index);
  EXPECT_GT(trace.summary.chunks.size(), 20u);
  ExpectSameRecords(records, trace.records);
  EXPECT_EQ(trace.summary.records(), records.size());
  EXPECT_EQ(trace.summary.file_size, bytes.size());
}

TEST(RoundTrip, ChunkEveryRecordAndDefaults) {
  std::vector<Record> records = ManySteps(3);
  [&]<size_t... kIndex>(std::index_sequence<kIndex...>) {
    // Every kind with every field at its default.
    (records.emplace_back(std::in_place_index<kIndex>), ...);
  }(std::make_index_sequence<kRecordKindCount>());
  Trace trace = ReadTraceBytesAll(Write(records, 0));
  EXPECT_TRUE(trace.summary.status.ok());
  EXPECT_EQ(trace.summary.chunks.size(), records.size() + 2);
  ExpectSameRecords(records, trace.records);
}

TEST(SequenceCoder, ExtremesRoundTrip) {
  std::vector<int64_t> sequence = {-1, 0, 5, 6, -1, 7, 3, INT64_MAX, -1, 1, INT64_MIN + 2, -2};
  SequenceCoder encoder;
  SequenceCoder decoder;
  for (int64_t s : sequence) {
    int64_t stored = 0;
    ASSERT_TRUE(encoder.Encode(s, &stored)) << s;
    EXPECT_EQ(decoder.Decode(stored), s);
  }
  SequenceCoder steps;
  int64_t stored = 0;
  EXPECT_TRUE(steps.Encode(41, &stored));
  EXPECT_TRUE(steps.Encode(42, &stored));
  EXPECT_EQ(stored, 2);  // zigzag(+1)
  // The one value 2^63 from the cursor would be stored as -1, which means none.
  SequenceCoder far;
  EXPECT_FALSE(far.Encode(INT64_MIN, &stored));
}

// Step coding (1.10; recent ids, 1.11; record offset deltas, 1.12; recent ids by kind, 1.13; node
// execution times from their op's, 1.14; times from the previous steps', 1.15) changes the bytes,
// not the records: written with it and without, a trace reads back the same, record for record,
// in one chunk and in many, whole and cut anywhere.
TEST(RoundTrip, StepCodingReadsAsThePlainCoding) {
  std::vector<Record> records = ManySteps(12);
  std::vector<Record> every = EveryKind(1000, 7, 5'000'000'000);
  records.insert(records.end(), every.begin(), every.end());
  for (size_t chunk : {size_t{4} << 20, size_t{700}}) {
    std::string plain = Write(records, chunk, false);
    std::string stepped = Write(records, chunk, true);
    Trace a = ReadTraceBytesAll(plain);
    Trace b = ReadTraceBytesAll(stepped);
    ASSERT_TRUE(a.summary.status.ok()) << a.summary.status.message();
    ASSERT_TRUE(b.summary.status.ok()) << b.summary.status.message();
    ExpectSameRecords(records, a.records);
    ExpectSameRecords(a.records, b.records);
    EXPECT_EQ(a.summary.header.oldest_reader_minor, 0);
    EXPECT_EQ(b.summary.header.oldest_reader_minor, 15);
    EXPECT_LT(stepped.size(), plain.size());
    // Record batches carry the offset deltas' flag (chunk header bytes 6 and 7), others none.
    for (const ChunkInfo& c : b.summary.chunks) {
      EXPECT_EQ(stepped[c.offset + 6], c.type == 2 ? 1 : 0) << c.offset;
      EXPECT_EQ(stepped[c.offset + 7], 0);
    }
    for (const ChunkInfo& c : a.summary.chunks) EXPECT_EQ(plain[c.offset + 6], 0);
    if (chunk != 700) continue;
    ASSERT_GT(b.summary.chunks.size(), 6u);
    // Cut anywhere: every whole chunk before the cut, and only those, decode alone.
    for (size_t cut = 16; cut < stepped.size(); cut += 37) {
      Trace cut_trace = ReadTraceBytesAll(std::string_view(stepped).substr(0, cut));
      size_t whole = 0;
      size_t kept = 0;
      for (const ChunkInfo& c : b.summary.chunks) {
        if (c.offset + 24 + c.compressed_bytes > cut) break;
        ++whole;
        kept += c.records;
      }
      ASSERT_EQ(cut_trace.summary.chunks.size(), whole) << cut;
      ExpectSameRecords(std::vector<Record>(b.records.begin(),
                                            b.records.begin() + static_cast<ptrdiff_t>(kept)),
                        cut_trace.records);
    }
  }
}

// 1.12's record offset deltas: a finished batch's `records` vector turned into differences
// (the element before minus this one: the earlier record's size plus 4, small and positive)
// and back gives the same bytes; bytes that hold no such vector are refused, untouched.
TEST(RecordOffsetDeltas, RoundTripAndRefuseWhatIsNotABatch) {
  BatchEncoder encoder(1 << 16, BatchCoding::kStepsRecent);
  encoder.Reset(0, 0);
  for (const Record& r : ManySteps(2)) ASSERT_TRUE(encoder.Add(r).ok());
  std::span<uint8_t> finished = encoder.Finish();
  const std::vector<uint8_t> batch(finished.begin(), finished.end());
  std::vector<uint8_t> coded = batch;
  ASSERT_TRUE(RecordOffsetDeltas(coded, true));
  EXPECT_NE(coded, batch);
  const auto* records = flatbuffers::GetRoot<fb::RecordBatch>(batch.data())->records();
  ASSERT_GT(records->size(), 2u);
  const size_t first = reinterpret_cast<const uint8_t*>(records->data()) - batch.data();
  EXPECT_EQ(LoadLe32(coded.data() + first), LoadLe32(batch.data() + first));
  for (size_t i = 1; i < records->size(); ++i) {
    const uint32_t delta = LoadLe32(coded.data() + first + 4 * i);
    EXPECT_GE(delta, 8u) << i;
    EXPECT_LT(delta, 4096u) << i;
  }
  ASSERT_TRUE(RecordOffsetDeltas(coded, false));
  EXPECT_EQ(coded, batch);

  std::vector<uint8_t> tiny = {1, 2, 3};
  EXPECT_FALSE(RecordOffsetDeltas(tiny, false));
  // The root offset, then the vector's length, pointing past the end.
  std::vector<uint8_t> bad_root = batch;
  StoreLe32(bad_root.data(), static_cast<uint32_t>(bad_root.size()));
  EXPECT_FALSE(RecordOffsetDeltas(bad_root, false));
  EXPECT_EQ(LoadLe32(bad_root.data()), bad_root.size());
  std::vector<uint8_t> bad_length = batch;
  StoreLe32(bad_length.data() + first - 4, 0xffffffffu);
  EXPECT_FALSE(RecordOffsetDeltas(bad_length, false));
  EXPECT_TRUE(std::equal(bad_length.begin() + first, bad_length.end(), batch.begin() + first));
}

// A chunk flag this reader does not know for its chunk type (the offset deltas' flag on a
// FileInfo chunk, with a checksum that matches) makes the chunk corrupt, not misread.
TEST(RecordOffsetDeltas, FlagOnAnotherChunkTypeIsCorrupt) {
  std::string trace = Write(ManySteps(2));
  constexpr size_t kFirstChunk = 16;
  ASSERT_EQ(trace[kFirstChunk + 4], 1);  // FileInfo.
  auto* header = reinterpret_cast<uint8_t*>(trace.data() + kFirstChunk);
  StoreLe16(header + 6, kChunkFlagOffsetDeltas);
  StoreLe64(header + 16, ChunkChecksum(header, header + 24, LoadLe32(header + 8)));
  Trace read = ReadTraceBytesAll(trace);
  EXPECT_EQ(read.summary.status.code(), StatusCode::kCorrupt);
  EXPECT_NE(read.summary.status.message().find("chunk 1 @ 0x10"), std::string::npos)
      << read.summary.status.message();
  EXPECT_FALSE(read.summary.has_info);
}

// A step-coded batch whose time column does not match its records is corrupt, said so, and
// the reader goes on.
TEST(RoundTrip, StepCodedBatchWithABadColumnIsCorrupt) {
  for (int change : {-1, +1})
  for (BatchCoding coding :
       {BatchCoding::kSteps, BatchCoding::kStepsExecTimes, BatchCoding::kStepsPredictedTimes}) {
    BatchEncoder encoder(1 << 16, coding);
    encoder.Reset(0, 0);
    for (const Record& r : ManySteps(1)) ASSERT_TRUE(encoder.Add(r).ok());
    std::span<const uint8_t> finished = encoder.Finish();
    std::vector<uint8_t> payload(finished.begin(), finished.end());
    const auto* column = flatbuffers::GetRoot<fb::RecordBatch>(payload.data())->times();
    ASSERT_NE(column, nullptr);
    ASSERT_GT(column->size(), 2u);
    uint8_t* times = payload.data() + (column->data() - payload.data());
    // One varint less (the last one's continuation bit set) or one more (a continuation bit
    // cleared) in the same bytes.
    if (change < 0) {
      times[column->size() - 1] |= 0x80;
    } else {
      size_t at = 0;
      while (at < column->size() && times[at] < 0x80) ++at;
      ASSERT_LT(at, column->size());
      times[at] &= 0x7f;
    }
    const auto* batch = flatbuffers::GetRoot<fb::RecordBatch>(payload.data());
    DecodedBatch decoded = DecodeBatch(*batch, [](const Record&) {});
    EXPECT_TRUE(decoded.bad_coding) << change;
  }
}

// A batch of a coding this reader does not know (6) is corrupt, its records not decoded.
TEST(RoundTrip, UnknownBatchCodingIsCorrupt) {
  BatchEncoder encoder(1 << 16, BatchCoding::kStepsPredictedTimes);
  encoder.Reset(0, 0);
  for (const Record& r : ManySteps(1)) ASSERT_TRUE(encoder.Add(r).ok());
  std::span<uint8_t> payload = encoder.Finish();
  const auto* batch = flatbuffers::GetRoot<fb::RecordBatch>(payload.data());
  const uint8_t* coding = reinterpret_cast<const flatbuffers::Table*>(batch)->GetAddressOf(
      fb::RecordBatch::VT_CODING);
  ASSERT_NE(coding, nullptr);
  ASSERT_EQ(*coding, 5);
  payload[static_cast<size_t>(coding - payload.data())] = 6;
  size_t records = 0;
  DecodedBatch decoded = DecodeBatch(*batch, [&](const Record&) { ++records; });
  EXPECT_TRUE(decoded.bad_coding);
  EXPECT_EQ(records, 0u);
}

TEST(Writer, IdTooLargeIsDroppedAndWriterGoesOn) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, SampleFileInfo());
  TensorInfo good;
  good.tensor = 5;
  TensorInfo bad;
  bad.tensor = 6;
  bad.grad_fn = kMaxObjectId + 1;
  TensorInfo after;
  after.tensor = 7;  // Coded against high = 5: the dropped record left no trace in the cursor.
  EXPECT_TRUE(writer->Append(good).ok());
  Status dropped = writer->Append(bad);
  EXPECT_EQ(dropped.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(writer->Append(after).ok());
  EXPECT_TRUE(writer->Close().ok());
  Trace trace = ReadTraceBytesAll(out);
  ASSERT_EQ(trace.records.size(), 2u);
  EXPECT_EQ(std::get<TensorInfo>(trace.records[1]).tensor, 7u);
}

// 1.11's recent ids count every id use: a dropped record's uses are taken back, or the ids after
// it would be read as others.
TEST(Writer, ADroppedRecordLeavesTheRecentIdsAsTheyWere) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, SampleFileInfo());
  TensorInfo good;
  good.tensor = 5;
  good.storage = 9;
  TensorInfo bad;
  bad.tensor = 9;
  bad.storage = 5;
  bad.grad_fn = kMaxObjectId + 1;
  TensorInfo after;  // Both ids used before: coded as how many uses ago.
  after.tensor = 5;
  after.storage = 9;
  EXPECT_TRUE(writer->Append(good).ok());
  EXPECT_EQ(writer->Append(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(writer->Append(after).ok());
  EXPECT_TRUE(writer->Close().ok());
  Trace trace = ReadTraceBytesAll(out);
  ASSERT_EQ(trace.records.size(), 2u);
  EXPECT_EQ(std::get<TensorInfo>(trace.records[1]).tensor, 5u);
  EXPECT_EQ(std::get<TensorInfo>(trace.records[1]).storage, 9u);
}

// 1.15 codes an op's times from those of the steps before: a dropped op's times are taken back,
// or the times after it would be read wrong.
TEST(Writer, ADroppedOpLeavesTheStepTimesAsTheyWere) {
  const std::vector<Record> records = TrainingSteps(6);
  std::vector<Record> with_bad;
  size_t bad_ops = 0;
  for (const Record& r : records) {
    const auto* op = std::get_if<OpRecord>(&r);
    if (op != nullptr && op->op > 10) {
      OpRecord bad = *op;  // Its times coded, then its id found too large.
      bad.start_ns += 12345;
      bad.end_ns += 67890;
      bad.parent = kMaxObjectId + 1;
      with_bad.push_back(bad);
      ++bad_ops;
    }
    with_bad.push_back(r);
  }
  std::string out;
  auto writer = TraceWriter::ToString(&out, SampleFileInfo());
  size_t refused = 0;
  for (const Record& r : with_bad) refused += !writer->Append(r).ok();
  EXPECT_TRUE(writer->Close().ok());
  EXPECT_GT(bad_ops, 10u);
  EXPECT_EQ(refused, bad_ops);
  Trace trace = ReadTraceBytesAll(out);
  ASSERT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  ExpectSameRecords(records, trace.records);
}

template <class T>
struct ElementOf {  // The struct a field holds: itself, or its vector's elements.
  using Type = T;
};

template <class E>
struct ElementOf<std::vector<E>> {
  using Type = E;
};

template <class E>
constexpr char kTypeKey = 0;  // One address per type.

// Every E that the fields of `s` hold, appended to `out`.
template <class E, class S>
void Gather(const S& s, std::vector<E>& out) {
  ForEachField(s, [&](const auto&, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, E>) out.push_back(value);
    if constexpr (std::is_same_v<T, std::vector<E>>) {
      out.insert(out.end(), value.begin(), value.end());
    }
  });
}

// The names of the fields that are at their default in every one of `all` (structs of one type),
// then those of the structs their fields hold (each struct type once, all its instances together:
// an op's inputs and outputs are one set of TensorUses).
template <HasFields S>
std::vector<std::string> FieldsAtDefault(const std::vector<S>& all, const std::string& prefix) {
  std::vector<std::string> out;
  std::vector<std::string> inner;
  std::vector<const void*> seen;  // The inner struct types already looked into.
  const S defaults{};
  ForEachField(defaults, [&](const auto& field, const auto& initial) {
    bool changed = false;
    for (const S& s : all) changed |= field.Of(s) != initial;
    if (!changed) out.push_back(prefix + field.name);
    using E = typename ElementOf<std::remove_cvref_t<decltype(initial)>>::Type;
    if constexpr (HasFields<E>) {
      if (std::find(seen.begin(), seen.end(), &kTypeKey<E>) != seen.end()) return;
      seen.push_back(&kTypeKey<E>);
      std::vector<E> held;
      for (const S& s : all) Gather(s, held);
      std::vector<std::string> names = FieldsAtDefault(held, prefix + field.name + ".");
      inner.insert(inner.end(), names.begin(), names.end());
    }
  });
  out.insert(out.end(), inner.begin(), inner.end());
  return out;
}

// The round trips above compare every field: the samples must set each of them.
TEST(SampleRecords, SetEveryField) {
  for (const Record& record : EveryKind(1000, 10, 5'000'000'000)) {
    std::visit(
        [&](const auto& r) {
          EXPECT_EQ(FieldsAtDefault(std::vector{r}, ""), std::vector<std::string>())
              << RecordKindName(record);
        },
        record);
  }
  EXPECT_EQ(FieldsAtDefault(std::vector{SampleFileInfo()}, ""), std::vector<std::string>());
}

// "kind" is the record's kind, then every field under its own name.
TEST(Json, EveryFieldUnderItsName) {
  for (const Record& record : EveryKind(1000, 10, 5'000'000'000)) {
    nlohmann::ordered_json json = RecordToJson(record);
    EXPECT_EQ(json.begin().key(), "kind");
    EXPECT_EQ(json["kind"], RecordKindName(record));
    std::visit(
        [&](const auto& r) {
          EXPECT_EQ(json.size(), 1 + std::tuple_size_v<decltype(
                                         FieldList<std::remove_cvref_t<decltype(r)>>::kFields)>)
              << json.dump();
        },
        record);
  }
}

TEST(Records, KindNames) {
  EXPECT_STREQ(RecordKindName(Record(OpRecord{})), "op");
  EXPECT_STREQ(RecordKindNameAt(0), "string");
  EXPECT_STREQ(RecordKindNameAt(6), "node_exec");
  EXPECT_STREQ(RecordKindNameAt(11), "fingerprint");
  EXPECT_STREQ(RecordKindNameAt(kRecordKindCount), "unknown");
}

}  // namespace
}  // namespace torchrr::format
