// A trace file: the writer's files and its errors, and a reader that survives cuts, flips and any
// piece size.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "container.h"
#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#include "trace_test_helpers.h"

namespace torchrr::format {
namespace {

using testing::ExpectSameRecords;
using testing::ManySteps;
using testing::SampleFileInfo;
using testing::Write;

// Fails every write after the first `writes`.
class FailingSink : public ByteSink {
 public:
  explicit FailingSink(int writes) : writes_(writes) {}
  Status Write(const void*, size_t) override {
    if (writes_-- <= 0) return Status(StatusCode::kIoError, "disk full");
    return Status::Ok();
  }

 private:
  int writes_;
};

TEST(Writer, WriteErrorIsSticky) {
  auto writer = TraceWriter::Create(std::make_unique<FailingSink>(2), SampleFileInfo());
  ASSERT_TRUE(writer.ok());
  std::vector<Record> records = ManySteps(2);
  for (const Record& r : records) EXPECT_TRUE((*writer)->Append(r).ok());
  Status flushed = (*writer)->Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kIoError);
  EXPECT_EQ((*writer)->Append(records[0]).code(), StatusCode::kIoError);
  EXPECT_EQ((*writer)->Close().code(), StatusCode::kIoError);
}

TEST(Writer, OpenReportsThePath) {
  auto writer = TraceWriter::Open("/nonexistent-dir/x.trr", SampleFileInfo());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kIoError);
  EXPECT_NE(writer.status().message().find("/nonexistent-dir/x.trr"), std::string::npos);
}

TEST(Writer, OpenRefusesAFifoWithoutBlocking) {
  // Opening a FIFO for writing blocks until a reader comes: the writer must not try.
  std::string path = ::testing::TempDir() + "/format_test_fifo.trr";
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto writer = TraceWriter::Open(path, SampleFileInfo());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(writer.status().message().find("not a regular file (a FIFO)"), std::string::npos)
      << writer.status().message();
  EXPECT_EQ(TraceWriter::CheckPath(path).code(), StatusCode::kInvalidArgument);
  ::unlink(path.c_str());
}

TEST(Writer, ASecondWriterOfOnePathFailsAndLeavesTheFirstWhole) {
  std::string path = ::testing::TempDir() + "/format_test_locked.trr";
  std::vector<Record> records = ManySteps(2);
  {
    auto first = TraceWriter::Open(path, SampleFileInfo());
    ASSERT_TRUE(first.ok());
    for (const Record& r : records) ASSERT_TRUE((*first)->Append(r).ok());
    ASSERT_TRUE((*first)->Flush().ok());
    auto second = TraceWriter::Open(path, SampleFileInfo());
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kIoError);
    EXPECT_NE(second.status().message().find("another recording is writing it"),
              std::string::npos) << second.status().message();
    EXPECT_EQ(TraceWriter::CheckPath(path).code(), StatusCode::kIoError);
    ASSERT_TRUE((*first)->Close().ok());
  }
  Trace trace = ReadTraceFileAll(path);
  EXPECT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  ExpectSameRecords(records, trace.records);
  EXPECT_TRUE(TraceWriter::CheckPath(path).ok());  // Closed: the lock went with it.
  EXPECT_TRUE(TraceWriter::Open(path, SampleFileInfo()).ok());
}

TEST(Writer, CheckPathChangesNothing) {
  std::string path = ::testing::TempDir() + "/format_test_unborn.trr";
  ::unlink(path.c_str());
  EXPECT_TRUE(TraceWriter::CheckPath(path).ok());
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "CheckPath created " << path;
  EXPECT_EQ(TraceWriter::CheckPath("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TraceWriter::CheckPath(::testing::TempDir()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TraceWriter::CheckPath("/nonexistent-dir/x.trr").code(), StatusCode::kIoError);
}

TEST(Writer, FileRoundTripAndCounters) {
  std::string path = ::testing::TempDir() + "/format_test_file.trr";
  std::vector<Record> records = ManySteps(5);
  {
    auto writer = TraceWriter::Open(path, SampleFileInfo(), WriterOptions{1000, 3});
    ASSERT_TRUE(writer.ok());
    for (const Record& r : records) ASSERT_TRUE((*writer)->Append(r).ok());
    EXPECT_GT((*writer)->chunks_written(), 2u);
    EXPECT_TRUE((*writer)->Flush().ok());
    EXPECT_EQ((*writer)->records_written(), records.size());
    EXPECT_EQ((*writer)->pending_raw_bytes(), 0u);
    EXPECT_GT((*writer)->raw_bytes_written(), 0u);
    // The destructor closes.
  }
  Trace trace = ReadTraceFileAll(path);
  EXPECT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  ExpectSameRecords(records, trace.records);
}

// A small trace of several chunks, and the records of each chunk.
struct SmallTrace {
  std::string bytes;
  std::vector<Record> records;
  ReadSummary summary;  // Of the whole file.
};

const SmallTrace& Small() {
  static const SmallTrace* small = [] {
    auto* s = new SmallTrace;
    s->records = ManySteps(2);
    s->bytes = Write(s->records, 300);
    s->summary = ReadTraceBytes(s->bytes, nullptr);
    return s;
  }();
  return *small;
}

// The records of the chunks that lie wholly before `end`, except chunk `skip` (1-based).
std::vector<Record> RecordsOfChunks(const SmallTrace& t, uint64_t end, size_t skip = 0) {
  std::vector<Record> out;
  size_t first = 0;
  for (size_t i = 0; i < t.summary.chunks.size(); ++i) {
    const ChunkInfo& c = t.summary.chunks[i];
    bool whole = c.offset + 24 + c.compressed_bytes <= end;
    if (whole && i + 1 != skip) {
      out.insert(out.end(), t.records.begin() + first, t.records.begin() + first + c.records);
    }
    first += c.records;
  }
  return out;
}

TEST(Reader, SmallTraceIsWhole) {
  const SmallTrace& t = Small();
  EXPECT_TRUE(t.summary.status.ok());
  EXPECT_GE(t.summary.chunks.size(), 5u);
  EXPECT_EQ(t.summary.chunks.front().type, 1);
  EXPECT_EQ(t.summary.chunks.back().type, 3);
}

TEST(Reader, CutAtEveryOffset) {
  const SmallTrace& t = Small();
  for (size_t cut = 0; cut < t.bytes.size(); ++cut) {
    Trace trace = ReadTraceBytesAll(std::string_view(t.bytes).substr(0, cut));
    if (cut < 16) {
      ASSERT_EQ(trace.summary.status.code(), StatusCode::kNotATrace) << cut;
      ASSERT_TRUE(trace.records.empty());
      continue;
    }
    size_t whole = 0;
    for (const ChunkInfo& c : t.summary.chunks) whole += c.offset + 24 + c.compressed_bytes <= cut;
    ASSERT_EQ(trace.summary.status.code(), StatusCode::kTruncated) << cut;
    ASSERT_EQ(trace.summary.status.message(), "truncated after chunk " + std::to_string(whole))
        << cut;
    ASSERT_EQ(trace.summary.chunks.size(), whole) << cut;
    ASSERT_FALSE(trace.summary.has_index);
    ExpectSameRecords(RecordsOfChunks(t, cut), trace.records);
  }
}

TEST(Reader, FlipEveryByte) {
  const SmallTrace& t = Small();
  const std::vector<ChunkInfo>& chunks = t.summary.chunks;
  for (size_t at = 0; at < t.bytes.size(); ++at) {
    std::string bytes = t.bytes;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
    Trace trace = ReadTraceBytesAll(bytes);
    size_t chunk = 0;  // 1-based number of the chunk the flip is in; 0: not in a chunk.
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (at >= chunks[i].offset && at < chunks[i].offset + 24 + chunks[i].compressed_bytes) {
        chunk = i + 1;
      }
    }
    if (chunk == 0) {
      // File header or trailer: no crash; a trailer flip loses no record.
      if (at >= 16) ExpectSameRecords(t.records, trace.records);
      continue;
    }
    ASSERT_EQ(trace.summary.status.code(), StatusCode::kCorrupt) << at;
    char place[64];
    std::snprintf(place, sizeof(place), "chunk %zu @ 0x%llx: ", chunk,
                  static_cast<unsigned long long>(chunks[chunk - 1].offset));
    ASSERT_EQ(trace.summary.status.message().rfind(place, 0), 0u)
        << at << ": " << trace.summary.status.message();
    ASSERT_NE(trace.summary.status.message().find("(corrupt)"), std::string::npos);
    ExpectSameRecords(RecordsOfChunks(t, t.bytes.size(), chunk), trace.records);
    ASSERT_EQ(trace.summary.has_info, chunk != 1) << at;
  }
}

TEST(Reader, FeedInPiecesOfEverySize) {
  const SmallTrace& t = Small();
  for (size_t piece = 1; piece <= t.bytes.size(); ++piece) {
    std::vector<Record> got;
    TraceParser parser([&](const Record& r) { got.push_back(r); });
    for (size_t at = 0; at < t.bytes.size(); at += piece) {
      ASSERT_TRUE(parser.Feed(t.bytes.data() + at, std::min(piece, t.bytes.size() - at)));
    }
    ReadSummary summary = parser.Finish();
    ASSERT_TRUE(summary.status.ok()) << piece << ": " << summary.status.message();
    ASSERT_TRUE(summary.has_index);
    ASSERT_EQ(got, t.records) << piece;
  }
}

TEST(Reader, TooNew) {
  std::string bytes = Small().bytes;
  const uint8_t version[8] = {2, 0, 0, 0, 2, 0, 0, 0};  // 2.0, oldest reader 2.0
  std::memcpy(bytes.data() + 8, version, sizeof(version));
  Trace trace = ReadTraceBytesAll(bytes);
  EXPECT_EQ(trace.summary.status.code(), StatusCode::kTooNew);
  EXPECT_EQ(trace.summary.status.message(),
            "written by torchrr format 2.0; this torchrr reads up to 1." +
                std::to_string(kFormatMinor));
  EXPECT_TRUE(trace.records.empty());
}

TEST(Reader, NewerMinorWithOldOldestReaderIsRead) {
  std::string bytes = Small().bytes;
  bytes[10] = 7;  // Format 1.7, oldest reader still 1.0.
  Trace trace = ReadTraceBytesAll(bytes);
  EXPECT_TRUE(trace.summary.status.ok());
  EXPECT_EQ(trace.summary.header.minor, 7);
  EXPECT_EQ(trace.records.size(), Small().records.size());
}

TEST(Reader, NotATrace) {
  EXPECT_EQ(ReadTraceBytesAll("").summary.status.code(), StatusCode::kNotATrace);
  Trace text = ReadTraceBytesAll("hello, this is not a trace at all");
  EXPECT_EQ(text.summary.status.code(), StatusCode::kNotATrace);
  EXPECT_EQ(text.summary.status.message(), "not a torchrr trace");
  Trace missing = ReadTraceFileAll("/nonexistent/run.trr");
  EXPECT_EQ(missing.summary.status.code(), StatusCode::kNotATrace);
  EXPECT_EQ(missing.summary.status.message(), "No such file or directory");
  Trace dir = ReadTraceFileAll("/");
  EXPECT_EQ(dir.summary.status.code(), StatusCode::kNotATrace);
}

TEST(Reader, GarbageBetweenChunksIsSkipped) {
  const SmallTrace& t = Small();
  const ChunkInfo& third = t.summary.chunks[2];
  std::string bytes = t.bytes;
  bytes.insert(third.offset, "TRRCgarbage TRRC\xff\xff\xff\xff TRRX");
  Trace trace = ReadTraceBytesAll(bytes);
  EXPECT_EQ(trace.summary.status.code(), StatusCode::kCorrupt);
  ExpectSameRecords(t.records, trace.records);
}

}  // namespace
}  // namespace torchrr::format
