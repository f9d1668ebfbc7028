// The recorder's queue encoding (format/src/record_bytes.cc): every record kind, with every field
// away from its default, comes back as it went in; cut or foreign bytes are refused, never read
// past.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sample_records.h"
#include "torchrr/format/record_bytes.h"

namespace torchrr::format {
namespace {

using testing::EveryKind;
using testing::ManySteps;

// Encodes `records` one after another, decodes them with one reader, compares them.
void ExpectRoundTrip(const std::vector<Record>& records) {
  ByteBuffer buffer;
  for (const auto& r : records) AppendRecordBytes(r, buffer);
  std::string_view bytes = buffer.view();
  RecordBytesReader reader;
  size_t pos = 0;
  for (const auto& want : records) {
    Record* got = reader.Next(bytes, &pos);
    ASSERT_NE(got, nullptr);
    ASSERT_EQ(*got, want);
  }
  EXPECT_EQ(pos, bytes.size());
  EXPECT_EQ(reader.Next(bytes, &pos), nullptr);
}

TEST(RecordBytes, EveryKindRoundTrips) {
  std::vector<Record> records = EveryKind(1000, 10, 5'000'000);
  ASSERT_EQ(records.size(), kRecordKindCount);
  ExpectRoundTrip(records);
}

TEST(RecordBytes, ScratchRecordsAreRefilledNotAppendedTo) {
  // Many records of each kind through the same scratch records: vectors shrink and grow.
  std::vector<Record> records = ManySteps(20);
  records.push_back(OpRecord{});  // Empty vectors after full ones.
  records.push_back(TensorInfo{});
  ExpectRoundTrip(records);
}

TEST(RecordBytes, CutOrForeignBytesAreRefused) {
  ByteBuffer buffer;
  for (const auto& r : EveryKind(1000, 10, 5'000'000)) AppendRecordBytes(r, buffer);
  std::string_view bytes = buffer.view();
  for (size_t cut = 1; cut < bytes.size(); cut += 7) {
    std::string_view head(bytes.data(), cut);
    RecordBytesReader reader;
    size_t pos = 0;
    while (reader.Next(head, &pos) != nullptr) ASSERT_LE(pos, cut);
    ASSERT_LT(pos, cut + 1);
  }
  RecordBytesReader reader;
  size_t pos = 0;
  std::string foreign = "\x7f\x01\x02";
  EXPECT_EQ(reader.Next(foreign, &pos), nullptr);
  std::string huge_count("\x02\x01\x00\x00\x00\xff\xff\xff\xff", 9);  // StackDef, 4G frames.
  pos = 0;
  EXPECT_EQ(reader.Next(huge_count, &pos), nullptr);
}

}  // namespace
}  // namespace torchrr::format
