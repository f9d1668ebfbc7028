#include "torchrr/format/reader.h"

#include <zstd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <span>
#include <unordered_map>

#include "container.h"
#include "record_codec.h"

namespace torchrr::format {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

// Payload bytes that may fail their checksum, in all, before the reader stops checking candidates:
// kChecksumSlack plus kChecksumPerByte for each byte of the file read so far. A damaged file fails
// a checksum once per damaged chunk (its bytes are then passed), far below this; a crafted file
// whose every few bytes are a chunk header claiming the rest of the file would otherwise cost
// time quadratic in its size. The slack is two chunks of the largest size.
constexpr uint64_t kChecksumSlack = 2 * uint64_t{kMaxChunkBytes};
constexpr uint64_t kChecksumPerByte = 8;

// 256 MiB: the most compressed bytes of out-of-order chunks held, waiting for the chunk they
// continue; past it the held chunk that comes first in sequence is read without it.
constexpr size_t kMaxHeldBytes = 256u << 20;

// Why a chunk header cannot be one the writer wrote, from its fields alone; "" when it could be.
std::string ImplausibleHeader(const ChunkHeader& h) {
  if (h.compressed_len > kMaxChunkBytes || h.raw_len > kMaxChunkBytes) return "length over 64 MiB";
  if (!KnownChunkFlags(h.type, h.flags)) return "unknown flags " + Hex(h.flags);
  if (h.compressed_len > ZSTD_compressBound(h.raw_len)) {
    return "compressed length over zstd's bound for its raw length";
  }
  return "";
}

// Why a whole chunk's payload cannot be the zstd frame its header describes, from the frame's
// header alone (a few bytes); "" when it could be.
std::string ImplausibleFrame(const ChunkHeader& h, const uint8_t* payload) {
  unsigned long long size = ZSTD_getFrameContentSize(payload, h.compressed_len);
  if (size == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
  if (size != ZSTD_CONTENTSIZE_UNKNOWN && size != h.raw_len) return "raw length mismatch";
  return "";
}

}  // namespace

// The parser walks a buffer of not-yet-consumed bytes. In order: the 16-byte file header, then
// chunks. After a chunk that fails (bad magic, bad length, checksum, zstd, verifier) it reports
// the chunk once and resyncs: it moves one byte on and scans for the next chunk magic whose chunk
// verifies, silently skipping candidates that do not. A candidate's header fields and its zstd
// frame header are checked before its payload is checksummed, and the bytes that fail their
// checksum are bounded (kChecksumPerByte), so resyncing is linear in the file's size.
//
// Record chunks are handed on in the order the writer wrote them, which their cursors give (each
// batch starts where the one before it ended: SPEC.md, "Id and time coding"): a chunk that does
// not continue the last one read is held until the one it continues has been read, or until the
// end; a chunk that is a byte-for-byte copy of an earlier one is dropped.
class TraceParser::Impl {
 public:
  explicit Impl(RecordCallback on_record) : on_record_(std::move(on_record)) {}
  ~Impl() {
    if (dctx_ != nullptr) ZSTD_freeDCtx(dctx_);
  }

  bool Feed(const void* data, size_t size) {
    if (stopped_ || finished_) return false;
    const auto* bytes = static_cast<const uint8_t*>(data);
    buf_.insert(buf_.end(), bytes, bytes + size);
    fed_ += size;
    Process();
    Compact();
    return !stopped_;
  }

  ReadSummary Finish() {
    if (finished_) return summary_;
    finished_ = true;
    eof_ = true;
    if (!stopped_) Process();
    while (!held_.empty()) {
      ReadHeld(FirstHeld(), 0);
      ReadHeldThatContinue();
    }
    summary_.file_size = fed_;
    if (!stopped_) Settle();
    return summary_;
  }

 private:
  enum class Outcome { kNeedMore, kDone, kBad };

  // The whole chunk at pos_ (its framing verified) or why not.
  struct Attempt {
    Outcome outcome = Outcome::kBad;
    std::string reason;
    size_t size = 0;        // kDone, or kBad with a verified checksum: the chunk's whole size.
  };

  // Where a batch's id and time cursors start or end (SPEC.md, "Id and time coding").
  struct Cursors {
    uint64_t high = 0;
    int64_t time_ns = 0;
    bool operator==(const Cursors&) const = default;
  };

  // A verified record chunk that does not continue the last batch read, held until one does.
  struct HeldChunk {
    uint64_t number;               // Its chunk number (file order).
    size_t index;                  // Its entry in summary_.chunks.
    Cursors base;
    bool neutral;                  // It ends where it starts (definitions only, say).
    uint16_t flags;                // Its chunk header's.
    std::vector<uint8_t> payload;  // Its zstd frame.
  };

  void Problem(StatusCode code, std::string message) {
    if (static_cast<int>(code) > static_cast<int>(summary_.status.code())) {
      summary_.status = Status(code, message);
    }
    summary_.warnings.push_back(std::move(message));
  }

  void Stop(StatusCode code, std::string message) {
    Problem(code, std::move(message));
    stopped_ = true;
  }

  uint64_t Offset() const { return buf_offset_ + pos_; }
  size_t Available() const { return buf_.size() - pos_; }
  const uint8_t* At() const { return buf_.data() + pos_; }

  // Drops the consumed bytes once they are at least half the buffer, so that each byte is moved
  // at most once on average, also while a long chunk is waited for.
  void Compact() {
    if (pos_ > 0 && pos_ >= buf_.size() / 2) {
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(pos_));
      buf_offset_ += pos_;
      pos_ = 0;
    }
  }

  void Process() {
    if (!header_done_ && !ParseHeader()) return;
    while (!stopped_) {
      if (resyncing_ && !SeekCandidate()) return;
      size_t available = Available();
      if (available < 4) {
        if (!eof_ || available == 0) return;
        if (!resyncing_ && (std::memcmp(At(), kChunkMagic, available) == 0 ||
                            std::memcmp(At(), kTrailerMagic, available) == 0)) {
          cut_ = Cut{chunk_number_ + 1, Offset()};  // Cut inside a chunk's magic.
          pos_ = buf_.size();
          return;
        }
        Bad("bad chunk magic");  // A few stray bytes at the end.
        continue;
      }
      if (std::memcmp(At(), kChunkMagic, 4) == 0) {
        Attempt attempt = TryChunk();
        if (attempt.outcome == Outcome::kNeedMore) {
          if (!eof_) return;
          if (!resyncing_) {
            // Cut inside this chunk, or its length is corrupt: it is a cut unless a chunk that
            // verifies follows.
            cut_ = Cut{chunk_number_ + 1, Offset()};
            resyncing_ = true;
          }
          ++pos_;
          continue;
        }
        if (attempt.outcome == Outcome::kDone) {
          pos_ += attempt.size;
          resyncing_ = false;
          continue;
        }
        if (attempt.size > 0) {
          // Checksummed, so the framing is right even though the content is not: skip it whole.
          ReportCut();
          ++chunk_number_;
          Problem(StatusCode::kCorrupt, ChunkPlace(chunk_number_, Offset()) + ": " +
                                            attempt.reason + " (corrupt)");
          gap_ = true;
          pos_ += attempt.size;
          resyncing_ = false;
          continue;
        }
        Bad(attempt.reason);
        continue;
      }
      if (std::memcmp(At(), kTrailerMagic, 4) == 0) {
        if (available > kTrailerSize) {
          Bad("bad chunk magic");
          continue;
        }
        if (!eof_) return;
        if (available == kTrailerSize) {
          ParseTrailer();
          pos_ += kTrailerSize;
          return;
        }
        // Cut inside the trailer.
        if (!resyncing_) cut_ = Cut{chunk_number_ + 1, Offset()};
        pos_ = buf_.size();
        return;
      }
      Bad("bad chunk magic");
    }
  }

  // A failure at pos_: reported unless resyncing (then the candidate was not a chunk).
  void Bad(const std::string& reason) {
    if (!resyncing_) {
      ++chunk_number_;
      Problem(StatusCode::kCorrupt,
              ChunkPlace(chunk_number_, Offset()) + ": " + reason + " (corrupt)");
      resyncing_ = true;
      gap_ = true;
    }
    ++pos_;
  }

  static std::string ChunkPlace(uint64_t number, uint64_t offset) {
    return "chunk " + std::to_string(number) + " @ " + Hex(offset);
  }

  // A chunk verified after a chunk that ran past the end: that one was corrupt, not cut.
  void ReportCut() {
    if (!cut_.has_value()) return;
    ++chunk_number_;
    Problem(StatusCode::kCorrupt, ChunkPlace(cut_->number, cut_->offset) +
                                      ": length runs past the end of the file (corrupt)");
    gap_ = true;
    cut_.reset();
  }

  // Moves pos_ to the next byte that may start a chunk or the trailer. False: need more bytes.
  bool SeekCandidate() {
    while (Available() >= 4) {
      const uint8_t* start = At();
      const void* hit = std::memchr(start, 'T', Available() - 3);
      if (hit == nullptr) {
        pos_ = buf_.size() - 3;
        break;
      }
      pos_ += static_cast<const uint8_t*>(hit) - start;
      if (std::memcmp(At(), kChunkMagic, 4) == 0 || std::memcmp(At(), kTrailerMagic, 4) == 0) {
        return true;
      }
      ++pos_;
    }
    if (eof_) {
      pos_ = buf_.size();
      return false;
    }
    return false;
  }

  bool ParseHeader() {
    size_t available = Available();
    size_t magic_bytes = std::min(available, sizeof(kFileMagic));
    if (available == 0) {
      if (eof_) Stop(StatusCode::kNotATrace, "not a torchrr trace (empty)");
      return false;
    }
    if (std::memcmp(At(), kFileMagic, magic_bytes) != 0) {
      Stop(StatusCode::kNotATrace, "not a torchrr trace");
      return false;
    }
    if (available < kFileHeaderSize) {
      if (eof_) Stop(StatusCode::kNotATrace, "not a torchrr trace (ends inside the file header)");
      return false;
    }
    const uint8_t* p = At();
    FileHeader& h = summary_.header;
    h.major = LoadLe16(p + 8);
    h.minor = LoadLe16(p + 10);
    h.oldest_reader_major = LoadLe16(p + 12);
    h.oldest_reader_minor = LoadLe16(p + 14);
    if (h.oldest_reader_major > kFormatMajor ||
        (h.oldest_reader_major == kFormatMajor && h.oldest_reader_minor > kFormatMinor)) {
      Stop(StatusCode::kTooNew, "written by torchrr format " + std::to_string(h.major) + "." +
                                    std::to_string(h.minor) + "; this torchrr reads up to " +
                                    std::to_string(kFormatMajor) + "." +
                                    std::to_string(kFormatMinor));
      return false;
    }
    pos_ += kFileHeaderSize;
    header_done_ = true;
    return true;
  }

  Attempt TryChunk() {
    Attempt attempt;
    size_t available = Available();
    if (available < kChunkHeaderSize) {
      attempt.outcome = Outcome::kNeedMore;
      return attempt;
    }
    const uint8_t* p = At();
    ChunkHeader h = ParseChunkHeader(p);
    attempt.reason = ImplausibleHeader(h);
    if (!attempt.reason.empty()) return attempt;
    size_t whole = kChunkHeaderSize + h.compressed_len;
    if (available < whole) {
      attempt.outcome = Outcome::kNeedMore;
      return attempt;
    }
    const uint8_t* payload = p + kChunkHeaderSize;
    attempt.reason = ImplausibleFrame(h, payload);
    if (!attempt.reason.empty()) return attempt;
    if (failed_checksum_bytes_ + h.compressed_len > kChecksumSlack + kChecksumPerByte * Offset()) {
      PassedOver();
      attempt.reason = "not checked: over the work limit for damaged input";
      return attempt;
    }
    summary_.checksummed_bytes += h.compressed_len;
    if (ChunkChecksum(p, payload, h.compressed_len) != h.checksum) {
      failed_checksum_bytes_ += h.compressed_len;
      attempt.reason = "checksum mismatch";
      return attempt;
    }
    attempt.size = whole;  // From here on the framing is trusted.
    attempt.reason = Decompress(payload, h.compressed_len, h.raw_len, h.flags);
    if (attempt.reason.empty() && !VerifyPayload(h.type, raw_.data(), raw_.size())) {
      attempt.reason = "FlatBuffer fails verification";
    }
    if (!attempt.reason.empty()) return attempt;
    ReportCut();
    ++chunk_number_;
    attempt.outcome = Outcome::kDone;
    size_t index = summary_.chunks.size();
    summary_.chunks.push_back(ChunkInfo{Offset(), h.type, h.compressed_len, h.raw_len, 0});
    auto [copy, fresh] = checksums_.try_emplace(h.checksum, chunk_number_);
    if (!fresh) {
      Problem(StatusCode::kCorrupt, ChunkPlace(chunk_number_, Offset()) + ": a copy of chunk " +
                                        std::to_string(copy->second) + ", skipped (corrupt)");
      return attempt;
    }
    switch (h.type) {
      case kChunkFileInfo:
        summary_.info = DecodeFileInfo(*flatbuffers::GetRoot<fb::FileInfo>(raw_.data()));
        summary_.has_info = true;
        break;
      case kChunkRecordBatch:
        OrderBatch(index, h.flags, std::span<const uint8_t>(payload, h.compressed_len));
        break;
      case kChunkIndex: {
        const auto* index_table = flatbuffers::GetRoot<fb::Index>(raw_.data());
        index_entries_.clear();
        if (const auto* entries = index_table->chunks()) {
          for (const fb::ChunkEntry* e : *entries) {
            index_entries_.push_back(ChunkInfo{e->offset(), e->type(), e->compressed_len(),
                                               e->raw_len(), e->records()});
          }
        }
        index_offset_ = Offset();
        break;
      }
      default:
        break;  // A newer minor version's chunk type.
    }
    return attempt;
  }

  // Decompresses a zstd frame of exactly raw_len bytes into raw_ and undoes what `flags` say was
  // done to it; "" or why not.
  std::string Decompress(const uint8_t* payload, size_t compressed_len, uint32_t raw_len,
                         uint16_t flags) {
    if (dctx_ == nullptr) dctx_ = ZSTD_createDCtx();
    if (dctx_ == nullptr) return "zstd: out of memory";
    raw_.resize(raw_len);
    size_t n = ZSTD_decompressDCtx(dctx_, raw_.data(), raw_.size(), payload, compressed_len);
    if (ZSTD_isError(n)) return std::string("zstd: ") + ZSTD_getErrorName(n);
    if (n != raw_len) return "raw length mismatch";
    if ((flags & kChunkFlagOffsetDeltas) != 0 && !RecordOffsetDeltas(raw_, false)) {
      return "record offsets out of bounds";
    }
    return "";
  }

  // Says, once, that a candidate went unchecked for the work limit (kChecksumPerByte).
  void PassedOver() {
    if (warned_work_limit_) return;
    warned_work_limit_ = true;
    Problem(StatusCode::kCorrupt, "@ " + Hex(Offset()) +
                                      ": chunk candidates passed over unchecked (work limit for "
                                      "damaged input) (corrupt)");
  }

  // The verified RecordBatch chunk summary_.chunks[index] (its payload decompressed in raw_):
  // read now when it continues the last batch read, else held (SPEC.md, "Reading").
  void OrderBatch(size_t index, uint16_t flags, std::span<const uint8_t> payload) {
    const auto* batch = flatbuffers::GetRoot<fb::RecordBatch>(raw_.data());
    Cursors base{batch->base_high(), batch->base_time_ns()};
    if (Continues(base)) {
      ReadBatch(*batch, chunk_number_, index);
    } else {
      DecodedBatch decoded = DecodeBatch(*batch, [](const Record&) {});
      bool neutral = Cursors{decoded.end_high, decoded.end_time_ns} == base;
      held_bytes_ += payload.size();
      held_.push_back(HeldChunk{chunk_number_, index, base, neutral, flags,
                                std::vector<uint8_t>(payload.begin(), payload.end())});
      if (held_bytes_ <= kMaxHeldBytes) return;
      ReadHeld(FirstHeld(), 0);
    }
    ReadHeldThatContinue();
  }

  // Whether a batch starting at `base` comes next: it starts where the last batch read ended, or,
  // when that end is not known exactly (a damaged chunk or unknown records in between), no earlier.
  bool Continues(const Cursors& base) const {
    return next_exact_ && !gap_ ? base == next_ : base.high >= next_.high;
  }

  // Reads the held chunks that continue the last batch read, each in turn. Of two that start at
  // the same place, one that ends there too (definitions only) was written first: the writer's
  // next batch starts where the other ends.
  void ReadHeldThatContinue() {
    while (next_exact_ && !gap_) {
      size_t next = held_.size();
      for (size_t i = 0; i < held_.size(); ++i) {
        if (held_[i].base == next_ && (next == held_.size() || (held_[i].neutral &&
                                                                 !held_[next].neutral))) {
          next = i;
        }
      }
      if (next == held_.size()) return;
      ReadHeld(next, last_read_);
    }
  }

  // The held chunk that comes first in sequence (the lowest base cursors, then file order).
  size_t FirstHeld() const {
    size_t first = 0;
    for (size_t i = 1; i < held_.size(); ++i) {
      const Cursors& a = held_[i].base;
      const Cursors& b = held_[first].base;
      if (a.high < b.high || (a.high == b.high && a.time_ns < b.time_ns)) first = i;
    }
    return first;
  }

  // Reads held_[i] and drops it. `after`: the chunk it continues (0: it continues none read).
  void ReadHeld(size_t i, uint64_t after) {
    HeldChunk held = std::move(held_[i]);
    held_.erase(held_.begin() + static_cast<ptrdiff_t>(i));
    held_bytes_ -= held.payload.size();
    const ChunkInfo& chunk = summary_.chunks[held.index];
    std::string place = ChunkPlace(held.number, chunk.offset);
    std::string where = last_read_ == 0 ? "first" : "after chunk " + std::to_string(last_read_);
    Problem(StatusCode::kCorrupt,
            place + (after != 0 ? ": out of order, read " + where + ", which it continues"
                                : ": out of order and continues no chunk read, read " + where) +
                " (corrupt)");
    // The same bytes decompressed and verified when the chunk was read.
    (void)Decompress(held.payload.data(), held.payload.size(), chunk.raw_bytes, held.flags);
    ReadBatch(*flatbuffers::GetRoot<fb::RecordBatch>(raw_.data()), held.number, held.index);
  }

  // Hands on the records of a batch that is next in sequence; its end is where the next begins.
  void ReadBatch(const fb::RecordBatch& batch, uint64_t number, size_t index) {
    ChunkInfo& chunk = summary_.chunks[index];
    uint32_t records = 0;
    DecodedBatch decoded = DecodeBatch(batch, [&](const Record& record) {
      ++records;
      ++summary_.records_per_kind[record.index()];
      if (on_record_) on_record_(record);
    });
    if (decoded.bad_coding) {
      Problem(StatusCode::kCorrupt,
              ChunkPlace(number, chunk.offset) +
                  (batch.coding() > static_cast<uint8_t>(BatchCoding::kStepsPredictedTimes)
                       ? ": unknown record coding " + std::to_string(batch.coding())
                                      : std::string(": time column does not match its records")) +
                  " (corrupt)");
    }
    if (decoded.unknown > 0 && !warned_unknown_) {
      warned_unknown_ = true;
      summary_.warnings.push_back(ChunkPlace(number, chunk.offset) +
                                  ": skipped records of kinds newer than this torchrr");
    }
    chunk.records = records;
    summary_.compressed_bytes += chunk.compressed_bytes;
    summary_.raw_bytes += chunk.raw_bytes;
    next_ = Cursors{decoded.end_high, decoded.end_time_ns};
    next_exact_ = decoded.unknown == 0;
    gap_ = false;
    last_read_ = number;
  }

  void ParseTrailer() {
    const uint8_t* p = At();
    uint64_t index_offset = LoadLe64(p + 8);
    if (!index_offset_.has_value() || *index_offset_ != index_offset || LoadLe32(p + 4) != 0) {
      if (cut_.has_value() && cut_->offset == index_offset) {
        ReportCut();  // The index chunk's length was corrupt, not cut: the trailer follows it.
        return;
      }
      if (cut_.has_value()) return;  // Bytes of the chunk the input was cut in.
      Problem(StatusCode::kCorrupt, "trailer @ " + Hex(Offset()) + ": points at " +
                                        Hex(index_offset) + ", not at a verified index (corrupt)");
      return;
    }
    ReportCut();
    trailer_ok_ = true;
  }

  // At the end of the input: truncation, and whether the index matches what was read.
  void Settle() {
    if (cut_.has_value()) {
      Problem(StatusCode::kTruncated, "truncated after chunk " + std::to_string(cut_->number - 1));
      return;
    }
    if (!trailer_ok_) {
      if (summary_.status.ok() || !resyncing_) {
        Problem(StatusCode::kTruncated, "truncated after chunk " + std::to_string(chunk_number_));
      }
      return;
    }
    summary_.has_index = true;
    if (summary_.status.ok()) {
      // Every chunk before the index, exactly as read.
      bool same = index_entries_.size() + 1 == summary_.chunks.size();
      for (size_t i = 0; same && i < index_entries_.size(); ++i) {
        const ChunkInfo& a = index_entries_[i];
        const ChunkInfo& b = summary_.chunks[i];
        same = a.offset == b.offset && a.type == b.type &&
               a.compressed_bytes == b.compressed_bytes && a.raw_bytes == b.raw_bytes &&
               a.records == b.records;
      }
      if (!same) {
        Problem(StatusCode::kCorrupt, "index @ " + Hex(*index_offset_) +
                                          ": does not match the chunks read (corrupt)");
      }
    }
  }

  struct Cut {
    uint64_t number;  // The chunk the input ends in.
    uint64_t offset;
  };

  RecordCallback on_record_;
  std::vector<uint8_t> buf_;  // Bytes not consumed yet, from buf_offset_ on.
  size_t pos_ = 0;            // Next byte of buf_ to parse.
  uint64_t buf_offset_ = 0;   // File offset of buf_[0].
  uint64_t fed_ = 0;
  bool header_done_ = false;
  bool eof_ = false;
  bool stopped_ = false;
  bool finished_ = false;
  bool resyncing_ = false;
  bool warned_unknown_ = false;
  bool trailer_ok_ = false;
  uint64_t chunk_number_ = 0;  // Chunks seen so far, whole or corrupt; chunk 1 is the FileInfo.
  std::optional<Cut> cut_;
  std::optional<uint64_t> index_offset_;
  std::vector<ChunkInfo> index_entries_;
  uint64_t failed_checksum_bytes_ = 0;  // Payload bytes whose checksum did not match, in all.
  bool warned_work_limit_ = false;
  // Checksum -> number of every chunk read, to drop copies.
  std::unordered_map<uint64_t, uint64_t> checksums_;
  Cursors next_;               // Where the next batch in sequence starts...
  bool next_exact_ = true;     // ...exactly, or (false: unknown records) at the earliest.
  bool gap_ = false;           // A damaged chunk since the last batch read: its end is unknown.
  uint64_t last_read_ = 0;     // The number of the last batch read.
  std::vector<HeldChunk> held_;
  size_t held_bytes_ = 0;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<uint8_t> raw_;  // The decompressed payload of the current chunk.
  ReadSummary summary_;
};

TraceParser::TraceParser(RecordCallback on_record)
    : impl_(std::make_unique<Impl>(std::move(on_record))) {}
TraceParser::~TraceParser() = default;
bool TraceParser::Feed(const void* data, size_t size) { return impl_->Feed(data, size); }
ReadSummary TraceParser::Finish() { return impl_->Finish(); }

}  // namespace torchrr::format
