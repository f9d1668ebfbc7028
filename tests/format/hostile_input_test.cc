// The reader on files crafted to hurt it: fake chunk headers that would make resynchronizing
// quadratic. Whatever the file, the work stays linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "hostile_traces.h"
#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"

namespace torchrr::format {
namespace {

using testing::FakeChunkHeaders;

// 16 MiB of fake chunk headers: without a bound on the work per candidate, one pass checksums
// terabytes (over 60 s already at 16 MiB). The bound (reader.h): 9 x the size + 128 MiB.
TEST(HostileInput, FakeChunkHeadersResyncInLinearWork) {
  const size_t size = 16u << 20;
  for (bool plausible : {false, true}) {
    SCOPED_TRACE(plausible ? "plausible headers" : "headers with impossible lengths");
    std::string bytes = FakeChunkHeaders(size, plausible);
    auto start = std::chrono::steady_clock::now();
    // In pieces, as ReadTraceFile feeds a file.
    TraceParser parser(nullptr);
    for (size_t at = 0; at < bytes.size(); at += 1u << 20) {
      parser.Feed(bytes.data() + at, std::min<size_t>(1u << 20, bytes.size() - at));
    }
    ReadSummary summary = parser.Finish();
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(summary.status.code(), StatusCode::kCorrupt) << summary.status.message();
    EXPECT_EQ(summary.status.message().rfind("chunk 1 @ 0x10: ", 0), 0u)
        << summary.status.message();
    EXPECT_TRUE(summary.chunks.empty());
    EXPECT_LE(summary.checksummed_bytes, 9 * uint64_t{size} + (128u << 20));
    if (!plausible) EXPECT_EQ(summary.checksummed_bytes, 0u);  // Turned down from the header.
    EXPECT_LT(seconds, 20.0);  // Generous: well under a second on any machine.
  }
}

// A trace in many small chunks: the file info, record batches, the index.
struct Chunked {
  std::vector<Record> records;
  std::string bytes;
  size_t chunks = 0;
};

const Chunked& Small() {
  static const Chunked* small = [] {
    auto* c = new Chunked;
    c->records = testing::ManySteps(3);
    WriterOptions options;
    options.chunk_raw_bytes = 300;
    auto writer = TraceWriter::ToString(&c->bytes, testing::SampleFileInfo(), options);
    for (const Record& r : c->records) (void)writer->Append(r);
    (void)writer->Close();
    c->chunks = ReadTraceBytes(c->bytes, nullptr).chunks.size();
    return c;
  }();
  return *small;
}

// Records compare field by field; on a difference, says where.
void ExpectSameRecords(const std::vector<Record>& want, const std::vector<Record>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << "record " << i;
}

bool AnyWarningHas(const ReadSummary& summary, const std::string& text) {
  return std::any_of(summary.warnings.begin(), summary.warnings.end(),
                     [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

// The records of `bytes`, read whole and fed in pieces of several sizes: the same in every case.
std::vector<Record> ReadInPieces(const std::string& bytes, ReadSummary* summary) {
  Trace whole = ReadTraceBytesAll(bytes);
  for (size_t piece : {1, 7, 64, 1000}) {
    std::vector<Record> got;
    TraceParser parser([&](const Record& r) { got.push_back(r); });
    for (size_t at = 0; at < bytes.size(); at += piece) {
      parser.Feed(bytes.data() + at, std::min(piece, bytes.size() - at));
    }
    ReadSummary pieces = parser.Finish();
    EXPECT_TRUE(got == whole.records) << "pieces of " << piece;
    EXPECT_EQ(pieces.warnings, whole.summary.warnings) << "pieces of " << piece;
  }
  *summary = whole.summary;
  return whole.records;
}

// The work limit is never reached by a file that is only damaged: with every other record chunk
// flipped and one chunk's length claiming the rest of the file, every chunk that verifies is read.
TEST(HostileInput, DamageAloneStaysUnderTheWorkLimit) {
  const Chunked& t = Small();
  ReadSummary clean = ReadTraceBytes(t.bytes, nullptr);
  std::string bytes = t.bytes;
  std::vector<Record> kept;
  size_t first = 0;
  for (size_t i = 0; i < clean.chunks.size(); ++i) {
    const ChunkInfo& c = clean.chunks[i];
    bool damaged = c.type == 2 && i % 2 == 0;
    if (damaged) bytes[c.offset + 24 + c.compressed_bytes / 2] ^= 0x20;
    if (i == 3) {  // Its length (bytes 8..11) claims the rest of the file.
      uint32_t rest = static_cast<uint32_t>(bytes.size() - c.offset - 24);
      for (int k = 0; k < 4; ++k) bytes[c.offset + 8 + k] = static_cast<char>(rest >> (8 * k));
      damaged = true;
    }
    if (!damaged) {
      kept.insert(kept.end(), t.records.begin() + first, t.records.begin() + first + c.records);
    }
    first += c.records;
  }
  ReadSummary summary;
  ExpectSameRecords(kept, ReadInPieces(bytes, &summary));
  EXPECT_EQ(summary.status.code(), StatusCode::kCorrupt);
  EXPECT_FALSE(AnyWarningHas(summary, "work limit")) << ::testing::PrintToString(summary.warnings);
  EXPECT_FALSE(AnyWarningHas(summary, "out of order")) << ::testing::PrintToString(summary.warnings);
}

}  // namespace
}  // namespace torchrr::format
