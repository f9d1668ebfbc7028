#include "torchrr/format/trace_size.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include <zstd.h>

#include "container.h"

namespace torchrr::format {
namespace {

// ZSTD_FRAMEHEADERSIZE_MAX, which zstd.h gives only to static linking.
constexpr size_t kFrameHeaderMax = 18;

// Whether the zstd frame whose first bytes are `frame` could hold `raw_len` bytes.
bool FrameCouldBe(const uint8_t* frame, size_t size, uint32_t raw_len) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame, size);
  return content != ZSTD_CONTENTSIZE_ERROR &&
         (content == ZSTD_CONTENTSIZE_UNKNOWN || content == raw_len);
}

// The file's bytes through a 1 MiB window, read with pread: not mapped, since a file truncated
// while mapped (a new recording to the same path) would kill the reader with SIGBUS.
class Window {
 public:
  Window(int fd, uint64_t size) : fd_(fd), size_(size), block_(kBlock) {}
  uint64_t size() const { return size_; }

  // Reads all `n` bytes at `offset` into `out`; false when they cannot be read.
  bool ReadInto(uint64_t offset, uint8_t* out, size_t n) {
    size_t filled = 0;
    while (filled < n) {
      ssize_t got = ::pread(fd_, out + filled, n - filled, static_cast<off_t>(offset + filled));
      if (got <= 0) return false;
      filled += static_cast<size_t>(got);
    }
    return true;
  }

  // The bytes [offset, offset + n), n at most kBlock, or nullptr when they cannot be read.
  const uint8_t* At(uint64_t offset, size_t n) {
    if (offset < start_ || offset + n > start_ + filled_) {
      start_ = offset;
      filled_ = static_cast<size_t>(std::min<uint64_t>(kBlock, size_ - offset));
      if (n > filled_ || !ReadInto(start_, block_.data(), filled_)) {
        filled_ = 0;
        return nullptr;
      }
    }
    return block_.data() + (offset - start_);
  }

  // The offset of the first chunk magic after `from`, or size(). Searches what the window holds
  // before it reads more, so that resynchronising after each of many damaged headers close
  // together costs no more than reading the file once.
  uint64_t NextMagic(uint64_t from) {
    constexpr size_t kMagic = sizeof(kChunkMagic);
    for (uint64_t at = from + 1; at + kMagic <= size_;) {
      if ((at < start_ || at + kMagic > start_ + filled_) &&
          At(at, static_cast<size_t>(std::min<uint64_t>(kBlock, size_ - at))) == nullptr) {
        return size_;
      }
      const uint8_t* begin = block_.data() + (at - start_);
      const uint8_t* end = block_.data() + filled_;
      const uint8_t* found = std::search(begin, end, kChunkMagic, kChunkMagic + kMagic);
      if (found != end) return start_ + static_cast<uint64_t>(found - block_.data());
      at = start_ + filled_ - (kMagic - 1);  // A magic may straddle the window's end.
    }
    return size_;
  }

  static constexpr size_t kBlock = 1 << 20;

 private:
  int fd_;
  uint64_t size_;
  std::vector<uint8_t> block_;
  uint64_t start_ = 0;
  size_t filled_ = 0;
};

// The chunks of the file, walked as the reader walks them.
uint64_t SumRawLengths(Window& file) {
  // As the reader's: 128 MiB plus 8 bytes per byte of the file fail their checksum at most, so
  // that fake headers cost linear work.
  const uint64_t size = file.size();
  const uint64_t checksum_budget = (128ull << 20) + 8 * size;
  uint64_t checksummed = 0;
  uint64_t total = 0;
  uint64_t at = kFileHeaderSize;
  std::vector<uint8_t> payload;
  while (at + kChunkHeaderSize <= size) {
    const size_t head = static_cast<size_t>(
        std::min<uint64_t>(kChunkHeaderSize + kFrameHeaderMax, size - at));
    const uint8_t* header = file.At(at, head);
    if (header == nullptr) break;
    if (std::equal(kChunkMagic, kChunkMagic + sizeof(kChunkMagic), header)) {
      const ChunkHeader h = ParseChunkHeader(header);
      uint8_t copy[kChunkHeaderSize];
      std::copy(header, header + kChunkHeaderSize, copy);
      // The reader's checks before a checksum (reader.cc: ImplausibleHeader, ImplausibleFrame).
      if (h.compressed_len <= kMaxChunkBytes && h.raw_len <= kMaxChunkBytes &&
          KnownChunkFlags(h.type, h.flags) &&
          h.compressed_len <= ZSTD_compressBound(h.raw_len) &&
          h.compressed_len <= size - at - kChunkHeaderSize &&
          checksummed + h.compressed_len <= checksum_budget &&
          FrameCouldBe(header + kChunkHeaderSize,
                       std::min<size_t>(h.compressed_len, head - kChunkHeaderSize), h.raw_len)) {
        checksummed += h.compressed_len;
        const uint8_t* bytes = nullptr;
        if (h.compressed_len <= Window::kBlock) {
          bytes = file.At(at + kChunkHeaderSize, h.compressed_len);
        } else {
          payload.resize(h.compressed_len);
          if (file.ReadInto(at + kChunkHeaderSize, payload.data(), payload.size())) {
            bytes = payload.data();
          }
        }
        if (bytes != nullptr && ChunkChecksum(copy, bytes, h.compressed_len) == h.checksum) {
          total += h.raw_len;
          at += kChunkHeaderSize + h.compressed_len;
          continue;
        }
      }
    }
    at = file.NextMagic(at);  // Damage: on to the next chunk magic, as the reader resynchronises.
  }
  return total;
}

}  // namespace

uint64_t DecompressedTraceBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st;
  uint64_t total = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    Window file(fd, static_cast<uint64_t>(st.st_size));
    total = SumRawLengths(file);
  }
  ::close(fd);
  return total;
}

}  // namespace torchrr::format
