// The container around the FlatBuffers payloads: file header, chunk headers, trailer (SPEC.md).
// Internal to format/.
#ifndef TORCHRR_FORMAT_SRC_CONTAINER_H_
#define TORCHRR_FORMAT_SRC_CONTAINER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace torchrr::format {

inline constexpr uint8_t kFileMagic[8] = {'T', 'O', 'R', 'C', 'H', 'R', 'R', '\0'};
inline constexpr uint8_t kChunkMagic[4] = {'T', 'R', 'R', 'C'};
inline constexpr uint8_t kTrailerMagic[4] = {'T', 'R', 'R', 'X'};
inline constexpr size_t kFileHeaderSize = 16;
inline constexpr size_t kChunkHeaderSize = 24;
inline constexpr size_t kTrailerSize = 16;
// The checksum covers the chunk header up to (not including) the checksum itself.
inline constexpr size_t kChunkHeaderChecksummedSize = 16;
// 64 MiB: no chunk is larger; a header claiming more is corrupt. Checked before allocating.
inline constexpr uint32_t kMaxChunkBytes = 64u << 20;
// The writer keeps a chunk's raw payload well under kMaxChunkBytes: the target is clamped to this,
// and one record may add at most kMaxRecordBytes on top.
inline constexpr size_t kMaxChunkTargetBytes = 32u << 20;
inline constexpr size_t kMaxRecordBytes = 16u << 20;

enum ChunkType : uint16_t {
  kChunkFileInfo = 1,
  kChunkRecordBatch = 2,
  kChunkIndex = 3,
};

// Chunk flags (SPEC.md, "Chunk"). On a RecordBatch only (1.12): the elements of its `records`
// vector after the first are stored as differences (record_codec.h, RecordOffsetDeltas).
inline constexpr uint16_t kChunkFlagOffsetDeltas = 1;

// Whether a reader of this version knows what `flags` mean on a chunk of this type.
inline bool KnownChunkFlags(uint16_t type, uint16_t flags) {
  return flags == 0 || (type == kChunkRecordBatch && flags == kChunkFlagOffsetDeltas);
}

inline void StoreLe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void StoreLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void StoreLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t LoadLe16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t LoadLe32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct ChunkHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t compressed_len = 0;
  uint32_t raw_len = 0;
  uint64_t checksum = 0;
};

// Reads a header whose magic the caller has checked.
inline ChunkHeader ParseChunkHeader(const uint8_t* p) {
  ChunkHeader h;
  h.type = LoadLe16(p + 4);
  h.flags = LoadLe16(p + 6);
  h.compressed_len = LoadLe32(p + 8);
  h.raw_len = LoadLe32(p + 12);
  h.checksum = LoadLe64(p + 16);
  return h;
}

// Writes the first 16 bytes (all but the checksum).
inline void StoreChunkHeaderPrefix(uint8_t* p, uint16_t type, uint16_t flags,
                                   uint32_t compressed_len, uint32_t raw_len) {
  std::memcpy(p, kChunkMagic, 4);
  StoreLe16(p + 4, type);
  StoreLe16(p + 6, flags);
  StoreLe32(p + 8, compressed_len);
  StoreLe32(p + 12, raw_len);
}

// XXH64 (seed 0) over the header's first 16 bytes, then the payload.
uint64_t ChunkChecksum(const uint8_t* header, const uint8_t* payload, size_t payload_size);

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_SRC_CONTAINER_H_
