#include "torchrr/format/writer.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "byte_sinks.h"
#include "container.h"
#include "record_codec.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/version.h"

namespace torchrr::format {
namespace {

// The smallest zstd window that holds `bytes` (a chunk's target size), within zstd's bounds.
int WindowLog(size_t bytes) {
  const ZSTD_bounds bounds = ZSTD_cParam_getBounds(ZSTD_c_windowLog);
  int log = bounds.lowerBound;
  while (log < bounds.upperBound && (size_t{1} << log) < bytes) ++log;
  return log;
}

}  // namespace

// Writer thread only, like TraceWriter.
class TraceWriter::Impl {
 public:
  Impl(std::unique_ptr<ByteSink> sink, const WriterOptions& options)
      : sink_(std::move(sink)),
        chunk_target_(std::min(options.chunk_raw_bytes, kMaxChunkTargetBytes)),
        zstd_level_(options.zstd_level),
        step_coding_(options.step_coding),
        batch_(std::min(chunk_target_, kMaxChunkTargetBytes) + (64u << 10),
               options.step_coding ? BatchCoding::kStepsPredictedTimes : BatchCoding::kCursors) {
    batch_.Reset(0, 0);
  }

  ~Impl() {
    if (cctx_ != nullptr) ZSTD_freeCCtx(cctx_);
  }

  Status Start(const FileInfo& info) {
    cctx_ = ZSTD_createCCtx();
    if (cctx_ == nullptr) return Fail(Status(StatusCode::kIoError, "zstd: out of memory"));
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, zstd_level_);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 0);  // The chunk has its own checksum.
    // A window as large as the chunk: a training step's records repeat the step before's, and
    // zstd finds those repeats only within its window (512 KiB at level 1, less than one step of
    // the PEFT sample's records). Each chunk is one frame decoded in one call into a buffer of
    // its raw size, so the window costs a reader no memory beyond that buffer.
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_windowLog, WindowLog(chunk_target_));

    uint8_t header[kFileHeaderSize];
    std::memcpy(header, kFileMagic, sizeof(kFileMagic));
    StoreLe16(header + 8, kFormatMajor);
    StoreLe16(header + 10, kFormatMinor);
    StoreLe16(header + 12, kOldestReaderMajor);
    StoreLe16(header + 14, step_coding_ ? kOldestStepCodingReaderMinor : kOldestReaderMinor);
    TORCHRR_RETURN_IF_ERROR(WriteBytes(header, sizeof(header)));

    size_t estimate = EstimateEncodedSize(info).bytes;
    if (estimate > kMaxRecordBytes) {
      return Fail(Status(StatusCode::kInvalidArgument, "FileInfo is larger than 16 MiB"));
    }
    flatbuffers::FlatBufferBuilder fbb(estimate);
    EncodeFileInfo(info, fbb);
    return WriteChunk(kChunkFileInfo, fbb.GetBufferPointer(), fbb.GetSize(), 0);
  }

  Status Append(const Record& record) {
    if (!status_.ok()) return status_;
    if (closed_) return Status(StatusCode::kInvalidArgument, "Append after Close");
    EncodedSize size = EstimateEncodedSize(record);
    if (size.elements > kSmallRecordElements) {
      if (size.bytes > kMaxRecordBytes) {
        return Status(StatusCode::kInvalidArgument,
                      std::string(RecordKindName(record)) + " record larger than 16 MiB; dropped");
      }
      if (batch_.records() > 0 && batch_.raw_size() + size.bytes > kMaxChunkTargetBytes) {
        TORCHRR_RETURN_IF_ERROR(Flush());
      }
    }
    TORCHRR_RETURN_IF_ERROR(batch_.Add(record));
    if (batch_.raw_size() >= chunk_target_) return Flush();
    return Status::Ok();
  }

  Status Flush() {
    if (!status_.ok()) return status_;
    if (batch_.records() == 0) return Status::Ok();
    auto records = static_cast<uint32_t>(batch_.records());
    std::span<uint8_t> payload = batch_.Finish();
    uint16_t flags = 0;
    if (step_coding_ && RecordOffsetDeltas(payload, true)) flags = kChunkFlagOffsetDeltas;
    TORCHRR_RETURN_IF_ERROR(
        WriteChunk(kChunkRecordBatch, payload.data(), payload.size(), records, flags));
    records_written_ += records;
    raw_bytes_written_ += payload.size();
    // The next batch continues the cursors, so it codes like this one would have continued.
    batch_.Reset(batch_.high(), batch_.time_cursor());
    return Status::Ok();
  }

  Status Close() {
    if (closed_) return status_;
    Status flushed = Flush();
    closed_ = true;
    if (flushed.ok()) {
      flatbuffers::FlatBufferBuilder fbb(64 + chunks_.size() * 32);
      EncodeIndex(chunks_, fbb);
      uint64_t index_offset = bytes_written_;
      Status written = WriteChunk(kChunkIndex, fbb.GetBufferPointer(), fbb.GetSize(), 0);
      if (written.ok()) {
        uint8_t trailer[kTrailerSize];
        std::memcpy(trailer, kTrailerMagic, 4);
        StoreLe32(trailer + 4, 0);
        StoreLe64(trailer + 8, index_offset);
        written = WriteBytes(trailer, sizeof(trailer));
      }
    }
    Status sink_closed = sink_->Close();
    if (status_.ok() && !sink_closed.ok()) status_ = sink_closed;
    return status_;
  }

  uint64_t records_written() const { return records_written_; }
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t raw_bytes_written() const { return raw_bytes_written_; }
  uint64_t chunks_written() const { return chunks_.size(); }
  size_t pending_raw_bytes() const { return batch_.records() == 0 ? 0 : batch_.raw_size(); }

 private:
  // A record with at most this many elements in its strings and vectors takes well under 1 MiB
  // encoded: it cannot take a chunk below kMaxChunkTargetBytes near kMaxChunkBytes. Only the
  // others are looked at closer.
  static constexpr size_t kSmallRecordElements = 4096;

  Status Fail(Status status) {
    if (status_.ok()) status_ = std::move(status);
    return status_;
  }

  Status WriteBytes(const void* data, size_t size) {
    Status written = sink_->Write(data, size);
    if (!written.ok()) return Fail(std::move(written));
    bytes_written_ += size;
    return Status::Ok();
  }

  Status WriteChunk(uint16_t type, const uint8_t* raw, size_t raw_size, uint32_t records,
                    uint16_t flags = 0) {
    if (raw_size > kMaxChunkBytes) {
      return Fail(Status(StatusCode::kInvalidArgument, "chunk larger than 64 MiB"));
    }
    size_t bound = ZSTD_compressBound(raw_size);
    if (out_size_ < kChunkHeaderSize + bound) {
      out_size_ = kChunkHeaderSize + bound;
      out_.reset(new uint8_t[out_size_]);  // Not zeroed: pages are touched only as zstd writes.
    }
    size_t compressed =
        ZSTD_compress2(cctx_, out_.get() + kChunkHeaderSize, bound, raw, raw_size);
    if (ZSTD_isError(compressed)) {
      return Fail(Status(StatusCode::kIoError,
                         std::string("zstd: ") + ZSTD_getErrorName(compressed)));
    }
    if (compressed > kMaxChunkBytes) {
      return Fail(Status(StatusCode::kInvalidArgument, "compressed chunk larger than 64 MiB"));
    }
    uint8_t* header = out_.get();
    StoreChunkHeaderPrefix(header, type, flags, static_cast<uint32_t>(compressed),
                           static_cast<uint32_t>(raw_size));
    StoreLe64(header + kChunkHeaderChecksummedSize,
              ChunkChecksum(header, header + kChunkHeaderSize, compressed));
    ChunkInfo chunk{bytes_written_, type, static_cast<uint32_t>(compressed),
                    static_cast<uint32_t>(raw_size), records};
    TORCHRR_RETURN_IF_ERROR(WriteBytes(out_.get(), kChunkHeaderSize + compressed));
    chunks_.push_back(chunk);
    return Status::Ok();
  }

  std::unique_ptr<ByteSink> sink_;
  size_t chunk_target_;
  int zstd_level_;
  bool step_coding_;
  BatchEncoder batch_;
  ZSTD_CCtx* cctx_ = nullptr;
  // Chunk header + compressed payload: room for zstd's bound on a whole chunk (about its raw
  // size), of which a compressed chunk uses a tenth or less.
  std::unique_ptr<uint8_t[]> out_;
  size_t out_size_ = 0;
  std::vector<ChunkInfo> chunks_;
  Status status_;  // The first error; sticky.
  bool closed_ = false;
  uint64_t records_written_ = 0;
  uint64_t bytes_written_ = 0;
  uint64_t raw_bytes_written_ = 0;
};

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceWriter::~TraceWriter() {
  if (impl_ != nullptr) (void)impl_->Close();
}

StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path,
                                                         const FileInfo& info,
                                                         const WriterOptions& options) {
  StatusOr<std::unique_ptr<FileSink>> sink = FileSink::Open(path, options.replace_any_file);
  if (!sink.ok()) return sink.status();
  return Create(std::move(sink.value()), info, options);
}

Status TraceWriter::CheckPath(const std::string& path, bool replace_any_file) {
  return FileSink::CheckPath(path, replace_any_file);
}

StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(std::unique_ptr<ByteSink> sink,
                                                           const FileInfo& info,
                                                           const WriterOptions& options) {
  auto impl = std::make_unique<Impl>(std::move(sink), options);
  TORCHRR_RETURN_IF_ERROR(impl->Start(info));
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(impl)));
}

std::unique_ptr<TraceWriter> TraceWriter::ToString(std::string* out, const FileInfo& info,
                                                   const WriterOptions& options) {
  auto impl = std::make_unique<Impl>(std::make_unique<StringSink>(out), options);
  (void)impl->Start(info);  // A string sink does not fail; a bad FileInfo fails every Append.
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(impl)));
}

Status TraceWriter::Append(const Record& record) { return impl_->Append(record); }
Status TraceWriter::Flush() { return impl_->Flush(); }
Status TraceWriter::Close() { return impl_->Close(); }
uint64_t TraceWriter::records_written() const { return impl_->records_written(); }
uint64_t TraceWriter::bytes_written() const { return impl_->bytes_written(); }
uint64_t TraceWriter::raw_bytes_written() const { return impl_->raw_bytes_written(); }
uint64_t TraceWriter::chunks_written() const { return impl_->chunks_written(); }
size_t TraceWriter::pending_raw_bytes() const { return impl_->pending_raw_bytes(); }

}  // namespace torchrr::format
