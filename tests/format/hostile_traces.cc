#include "hostile_traces.h"

#include <algorithm>
#include <cstdint>

#include "torchrr/format/reader.h"

namespace torchrr::format::testing {
namespace {

constexpr size_t kChunkHeader = 24;
constexpr size_t kMaxChunk = 64u << 20;  // SPEC.md: no chunk length is larger.

void AppendLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>(value >> (8 * i));
}

}  // namespace

std::string FakeChunkHeaders(size_t size, bool plausible) {
  // The file header of format 1.1, oldest reader 1.0.
  std::string out("TORCHRR\0", 8);
  AppendLe(out, 1, 2);
  AppendLe(out, 1, 2);
  AppendLe(out, 1, 2);
  AppendLe(out, 0, 2);
  while (out.size() < size) {
    size_t left = size - out.size();
    if (left < kChunkHeader) {
      out.append(left, 'x');
      break;
    }
    uint64_t compressed = std::min(left - kChunkHeader, kMaxChunk);
    // zstd's bound on the compressed size of n raw bytes is a little over n: a raw length equal
    // to the compressed one is within it; one of 16 bytes is not.
    uint64_t raw = plausible ? compressed : 16;
    out += "TRRC";
    AppendLe(out, 2, 2);           // type: RecordBatch
    AppendLe(out, 0, 2);           // flags
    AppendLe(out, compressed, 4);
    AppendLe(out, raw, 4);
    AppendLe(out, 0x5eed5eed5eed5eedULL, 8);  // Never the checksum.
    if (plausible) {
      // A zstd frame header: magic, descriptor 0xe0 (single segment, 8-byte content size), size.
      AppendLe(out, 0xfd2fb528u, 4);
      out += static_cast<char>(0xe0);
      AppendLe(out, raw, 8);
    }
  }
  out.resize(size);
  return out;
}

std::string Rechunk(const std::string& trace, const std::vector<size_t>& chunks) {
  ReadSummary summary = ReadTraceBytes(trace, nullptr);
  std::string out = trace.substr(0, 16);
  uint64_t end = 16;
  for (const ChunkInfo& c : summary.chunks) {
    end = std::max(end, c.offset + kChunkHeader + c.compressed_bytes);
  }
  for (size_t i : chunks) {
    const ChunkInfo& c = summary.chunks.at(i);
    out += trace.substr(c.offset, kChunkHeader + c.compressed_bytes);
  }
  out += trace.substr(end);
  return out;
}

}  // namespace torchrr::format::testing
