// format::DecompressedTraceBytes: the bytes a trace's chunks decompress to, from their headers,
// in work linear in the file whatever it holds.
#include "torchrr/format/trace_size.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "hostile_traces.h"
#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#include "trace_test_helpers.h"

namespace torchrr::format {
namespace {

std::string WriteFile(const std::string& name, const std::string& bytes) {
  std::string path = ::testing::TempDir() + "/trace_size_test_" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string SampleTrace() {
  return testing::Write(testing::ManySteps(20), /*chunk_raw_bytes=*/4096);  // Several chunks.
}

TEST(TraceSize, CountsEveryChunkAndOnlyTheChunksThatVerify) {
  const std::string trace = SampleTrace();
  const uint64_t whole = DecompressedTraceBytes(WriteFile("whole.trr", trace));
  // The reader's own count of the chunks it verified.
  uint64_t read = 0;
  for (const ChunkInfo& chunk : ReadTraceBytes(trace, nullptr).chunks) read += chunk.raw_bytes;
  EXPECT_EQ(whole, read);
  EXPECT_GT(whole, trace.size());
  // Garbage in the middle of a chunk: that chunk no longer counts, the others still do.
  std::string damaged = trace;
  damaged[trace.size() / 2] ^= 0x5a;
  const uint64_t less = DecompressedTraceBytes(WriteFile("damaged.trr", damaged));
  EXPECT_LT(less, whole);
  EXPECT_GT(less, 0u);
  EXPECT_EQ(DecompressedTraceBytes(::testing::TempDir() + "/trace_size_test_missing"), 0u);
}

TEST(TraceSize, CountsAChunkLargerThanItsWindow) {
  // A FileInfo chunk of 3 MiB that zstd cannot shrink: its payload is read past the 1 MiB window.
  FileInfo info = testing::SampleFileInfo();
  uint64_t state = 88172645463325252ull;
  info.host.resize(3u << 20);
  for (char& c : info.host) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    c = static_cast<char>('a' + state % 26);
  }
  std::string trace;
  auto writer = TraceWriter::ToString(&trace, info);
  for (const Record& r : testing::ManySteps(2)) EXPECT_TRUE(writer->Append(r).ok());
  EXPECT_TRUE(writer->Close().ok());
  ASSERT_GT(trace.size(), 1u << 20);
  uint64_t read = 0;
  for (const ChunkInfo& chunk : ReadTraceBytes(trace, nullptr).chunks) read += chunk.raw_bytes;
  EXPECT_EQ(DecompressedTraceBytes(WriteFile("large.trr", trace)), read);
  EXPECT_GT(read, 3u << 20);
}

TEST(TraceSize, ARepeatFartherBackThanLevelOnesWindowIsFound) {
  // 768 KiB of records that zstd cannot shrink, written twice into one chunk, as a training step
  // of a larger model repeats the step before: the second copy costs little only when zstd's
  // window reaches back past level 1's own (512 KiB).
  std::vector<Record> step;
  uint64_t state = 88172645463325252ull;
  for (InternId id = 1; id <= 192; ++id) {
    StringDef def{id, std::string(4096, ' ')};
    for (char& c : def.text) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      c = static_cast<char>('a' + state % 26);
    }
    step.push_back(def);
  }
  auto size = [&](int copies) {
    std::vector<Record> records;
    for (int i = 0; i < copies; ++i) records.insert(records.end(), step.begin(), step.end());
    const std::string trace = testing::Write(records);
    EXPECT_EQ(ReadTraceBytes(trace, nullptr).chunks.size(), 3u);  // FileInfo, batch, index.
    return trace.size();
  };
  const size_t once = size(1);
  EXPECT_GT(once, 400u << 10);
  EXPECT_LT(size(2), once + once / 4);
}

TEST(TraceSize, FakeChunkHeadersCostLinearWork) {
  for (bool plausible : {false, true}) {
    const std::string path =
        WriteFile("fake.trr", testing::FakeChunkHeaders(16u << 20, plausible));
    const auto started = std::chrono::steady_clock::now();
    EXPECT_EQ(DecompressedTraceBytes(path), 0u);
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << plausible;
  }
}

}  // namespace
}  // namespace torchrr::format
