#include "torchrr/format/trace_size.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <zstd.h>

#include "container.h"

namespace torchrr::format {
namespace {

// Whether the zstd frame whose first bytes are `frame` could hold `raw_len` bytes.
bool FrameCouldBe(const uint8_t* frame, size_t size, uint32_t raw_len) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame, size);
  return content != ZSTD_CONTENTSIZE_ERROR &&
         (content == ZSTD_CONTENTSIZE_UNKNOWN || content == raw_len);
}

// The chunks of the file's bytes [data, data + size), walked as the reader walks them.
uint64_t SumRawLengths(const uint8_t* data, uint64_t size) {
  // As the reader's: 128 MiB plus 8 bytes per byte of the file fail their checksum at most, so
  // that fake headers cost linear work.
  const uint64_t checksum_budget = (128ull << 20) + 8 * size;
  uint64_t checksummed = 0;
  uint64_t total = 0;
  uint64_t at = kFileHeaderSize;
  while (at + kChunkHeaderSize <= size) {
    const uint8_t* header = data + at;
    if (std::equal(kChunkMagic, kChunkMagic + sizeof(kChunkMagic), header)) {
      const ChunkHeader h = ParseChunkHeader(header);
      const uint8_t* payload = header + kChunkHeaderSize;
      // The reader's checks before a checksum (reader.cc: ImplausibleHeader, ImplausibleFrame).
      if (h.compressed_len <= kMaxChunkBytes && h.raw_len <= kMaxChunkBytes && h.flags == 0 &&
          h.compressed_len <= ZSTD_compressBound(h.raw_len) &&
          h.compressed_len <= size - at - kChunkHeaderSize &&
          checksummed + h.compressed_len <= checksum_budget &&
          FrameCouldBe(payload, h.compressed_len, h.raw_len)) {
        checksummed += h.compressed_len;
        if (ChunkChecksum(header, payload, h.compressed_len) == h.checksum) {
          total += h.raw_len;
          at += kChunkHeaderSize + h.compressed_len;
          continue;
        }
      }
    }
    // Damage: on to the next chunk magic, as the reader resynchronises.
    const uint8_t* next = std::search(data + at + 1, data + size, kChunkMagic,
                                      kChunkMagic + sizeof(kChunkMagic));
    at = static_cast<uint64_t>(next - data);
  }
  return total;
}

}  // namespace

uint64_t DecompressedTraceBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st;
  uint64_t total = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) > kFileHeaderSize) {
    const size_t size = static_cast<size_t>(st.st_size);
    // Mapped, not read: the walk jumps over payloads that fail no check but their checksum.
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped != MAP_FAILED) {
      total = SumRawLengths(static_cast<const uint8_t*>(mapped), size);
      ::munmap(mapped, size);
    }
  }
  ::close(fd);
  return total;
}

}  // namespace torchrr::format
