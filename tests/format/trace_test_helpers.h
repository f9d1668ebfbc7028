// Helpers shared by the format's tests: a trace written to memory, records compared one by one.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sample_records.h"
#include "torchrr/format/writer.h"

namespace torchrr::format::testing {

// `records` written to memory, by default in the writer's own chunks.
inline std::string Write(const std::vector<Record>& records,
                         size_t chunk_raw_bytes = WriterOptions{}.chunk_raw_bytes,
                         bool step_coding = true) {
  std::string out;
  WriterOptions options;
  options.chunk_raw_bytes = chunk_raw_bytes;
  options.step_coding = step_coding;
  auto writer = TraceWriter::ToString(&out, SampleFileInfo(), options);
  for (const Record& r : records) EXPECT_TRUE(writer->Append(r).ok());
  EXPECT_TRUE(writer->Close().ok());
  return out;
}

inline void ExpectSameRecords(const std::vector<Record>& want, const std::vector<Record>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << "record " << i;
}

}  // namespace torchrr::format::testing
