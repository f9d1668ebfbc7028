// The reader on files crafted to hurt it: fake chunk headers that would make resynchronizing
// quadratic, and chunks moved or copied so that records would be read out of the order they were
// written in. Whatever the file, the work stays linear and the records come in sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "hostile_traces.h"
#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"

namespace torchrr::format {
namespace {

using testing::FakeChunkHeaders;
using testing::Rechunk;

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

// A trace in many small chunks: chunk 0 the file info, 1 .. n-2 record batches, n-1 the index.
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

// 0, 1, ..., n-1.
std::vector<size_t> InFileOrder(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  return order;
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

using Orders = std::vector<std::pair<std::string, std::vector<size_t>>>;

// Each of `orders` (a name, then Rechunk's chunks) reads back every record of `t` in sequence,
// kCorrupt, with the file info, and with a warning that contains `warning` (unless "").
void ExpectEachReadsWhole(const Chunked& t, const Orders& orders, const std::string& warning) {
  for (const auto& [name, chunks] : orders) {
    SCOPED_TRACE(name);
    ReadSummary summary;
    ExpectSameRecords(t.records, ReadInPieces(Rechunk(t.bytes, chunks), &summary));
    EXPECT_EQ(summary.status.code(), StatusCode::kCorrupt) << summary.status.message();
    EXPECT_TRUE(summary.has_info);
    if (!warning.empty()) {
      EXPECT_TRUE(AnyWarningHas(summary, warning)) << ::testing::PrintToString(summary.warnings);
    }
  }
}

TEST(HostileInput, MovedChunksAreReadInSequence) {
  const Chunked& t = Small();
  ASSERT_GE(t.chunks, 8u);
  const size_t n = t.chunks;
  Orders cases;
  std::vector<size_t> order = InFileOrder(n);
  std::swap(order[2], order[3]);
  cases.emplace_back("two neighbours swapped", order);
  order = InFileOrder(n);
  std::rotate(order.begin() + 1, order.begin() + 2, order.end() - 1);
  cases.emplace_back("the first batch moved last", order);
  order = InFileOrder(n);
  std::reverse(order.begin() + 1, order.end() - 1);
  cases.emplace_back("every batch reversed", order);
  order = InFileOrder(n - 1);  // No index: as if cut before it.
  std::swap(order[4], order[5]);
  cases.emplace_back("two batches swapped, no index", order);
  ExpectEachReadsWhole(t, cases, "out of order, read after chunk ");
  // The file info is no record chunk: moved, it is read where it is, and nothing is out of order.
  order = InFileOrder(n);
  std::rotate(order.begin(), order.begin() + 1, order.end() - 1);
  ExpectEachReadsWhole(t, {{"the file info moved last", order}}, "");
}

TEST(HostileInput, CopiedChunksAreDropped) {
  const Chunked& t = Small();
  const size_t n = t.chunks;
  Orders cases;
  std::vector<size_t> order = InFileOrder(n);
  order.insert(order.begin() + 3, 3);
  cases.emplace_back("a batch twice in a row", order);
  order = InFileOrder(n);
  for (size_t i = 1; i + 1 < n; ++i) order.insert(order.end() - 1, i);
  cases.emplace_back("every batch again", order);
  order = InFileOrder(n);
  order.insert(order.begin() + 2, 0);
  cases.emplace_back("the file info twice", order);
  ExpectEachReadsWhole(t, cases, ": a copy of chunk ");
}

// The records of every chunk of `t` but chunk `lost` (0-based, file order), in order.
std::vector<Record> RecordsWithout(const Chunked& t, size_t lost) {
  std::vector<Record> out;
  size_t first = 0;
  ReadSummary clean = ReadTraceBytes(t.bytes, nullptr);
  for (size_t i = 0; i < clean.chunks.size(); ++i) {
    if (i != lost) {
      out.insert(out.end(), t.records.begin() + first,
                 t.records.begin() + first + clean.chunks[i].records);
    }
    first += clean.chunks[i].records;
  }
  return out;
}

// A damaged chunk breaks the chain of cursors: the next chunk that verifies is read next, and
// nothing is held. A chunk cut out without a trace breaks it too: what follows is held to the
// end, then read in sequence.
TEST(HostileInput, AChunkLostDoesNotLoseTheRest) {
  const Chunked& t = Small();
  ReadSummary clean = ReadTraceBytes(t.bytes, nullptr);
  // A batch in the middle that moves the cursors (one of definitions only would not be missed):
  // of those with an op, the one with the most records.
  size_t lost = 0;
  size_t first = 0;
  for (size_t i = 0; i + 2 < clean.chunks.size(); ++i) {
    const auto begin = t.records.begin() + static_cast<ptrdiff_t>(first);
    const bool has_op = std::any_of(begin, begin + clean.chunks[i].records, [](const Record& r) {
      return std::holds_alternative<OpRecord>(r);
    });
    if (i >= 2 && has_op && (lost == 0 || clean.chunks[i].records > clean.chunks[lost].records)) {
      lost = i;
    }
    first += clean.chunks[i].records;
  }
  ASSERT_NE(lost, 0u);
  const ChunkInfo& c = clean.chunks[lost];
  std::string damaged = t.bytes;
  damaged[c.offset + 24 + c.compressed_bytes / 2] ^= 0x20;
  ReadSummary summary;
  ExpectSameRecords(RecordsWithout(t, lost), ReadInPieces(damaged, &summary));
  EXPECT_FALSE(AnyWarningHas(summary, "out of order"))
      << ::testing::PrintToString(summary.warnings);

  std::vector<size_t> order = InFileOrder(t.chunks);
  order.erase(order.begin() + lost);
  ExpectSameRecords(RecordsWithout(t, lost), ReadInPieces(Rechunk(t.bytes, order), &summary));
  EXPECT_TRUE(AnyWarningHas(summary, "out of order and continues no chunk read"))
      << ::testing::PrintToString(summary.warnings);
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
  EXPECT_FALSE(AnyWarningHas(summary, "out of order"))
      << ::testing::PrintToString(summary.warnings);
}

}  // namespace
}  // namespace torchrr::format
