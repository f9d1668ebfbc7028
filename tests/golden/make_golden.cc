// Writes the golden traces of tests/golden: run once by hand when a format version is added, never
// by the tests (which read the checked-in files, so a change that breaks reading old files fails).
//
//   build/bin/make_golden tests/golden
//
// v1_<minor>.trr: every record kind (tests/format/sample_records.cc, two steps) in several chunks,
// as this version writes them (v1_0.trr by format 1.0, v1_1.trr by 1.1; the older ones stay).
// errors/: truncated.trr (cut inside chunk 3), corrupt.trr (a payload byte of chunk 3 flipped),
// too_new.trr (format 2.0, oldest reader 2.0), not_a_trace.trr (text).
#include <cstdio>
#include <fstream>
#include <string>

#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"

namespace {

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::fprintf(stderr, "make_golden: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace torchrr::format;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_golden DIR (tests/golden)\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::string trace;
  {
    WriterOptions options;
    options.chunk_raw_bytes = 1000;  // Several chunks.
    auto writer = TraceWriter::ToString(&trace, testing::SampleFileInfo(), options);
    for (const Record& r : testing::ManySteps(2)) {
      if (!writer->Append(r).ok()) return 1;
    }
    if (!writer->Close().ok()) return 1;
  }
  ReadSummary summary = ReadTraceBytes(trace, nullptr);
  if (!summary.status.ok() || summary.chunks.size() < 4) {
    std::fprintf(stderr, "make_golden: the trace does not read back\n");
    return 1;
  }
  const ChunkInfo& third = summary.chunks[2];
  std::string corrupt = trace;
  corrupt[third.offset + 24 + third.compressed_bytes / 2] ^= 0x01;
  std::string too_new = trace;
  const char version[8] = {2, 0, 0, 0, 2, 0, 0, 0};
  too_new.replace(8, 8, version, 8);
  const std::string name = "/v" + std::to_string(kFormatMajor) + "_" +
                           std::to_string(kFormatMinor) + ".trr";
  bool ok = WriteFile(dir + name, trace) &&
            WriteFile(dir + "/errors/truncated.trr",
                      trace.substr(0, third.offset + 24 + third.compressed_bytes / 2)) &&
            WriteFile(dir + "/errors/corrupt.trr", corrupt) &&
            WriteFile(dir + "/errors/too_new.trr", too_new) &&
            WriteFile(dir + "/errors/not_a_trace.trr", "this is not a torchrr trace\n");
  return ok ? 0 : 1;
}
