#include "trace_sink.h"

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "native_stacks.h"

namespace torchrr::recorder {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// A chunk is written at least this often while records arrive, so a run killed without warning
// loses at most about this much of its trace.
constexpr auto kFlushInterval = std::chrono::milliseconds(500);
// The writer wakes when this much is queued, or every kPollInterval: waking it per op would cost
// the training thread a futex wake-up and a context switch per op.
constexpr size_t kWakeBytes = 1u << 20;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

template <typename T>
size_t VectorBytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

}  // namespace

size_t TraceSink::ApproxBytes(const format::Record& record) {
  size_t bytes = sizeof(format::Record);
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, format::OpRecord>) {
          bytes += VectorBytes(r.inputs) + VectorBytes(r.outputs) + VectorBytes(r.values);
          for (const auto& v : r.values) bytes += VectorBytes(v.ints) + VectorBytes(v.doubles);
        } else if constexpr (std::is_same_v<T, format::TensorInfo>) {
          bytes += VectorBytes(r.shape) + VectorBytes(r.strides);
        } else if constexpr (std::is_same_v<T, format::NodeRecord>) {
          bytes += VectorBytes(r.edges) + VectorBytes(r.saved);
        } else if constexpr (std::is_same_v<T, format::StackDef>) {
          bytes += VectorBytes(r.frames);
        } else if constexpr (std::is_same_v<T, format::StringDef>) {
          bytes += r.text.capacity();
        } else if constexpr (std::is_same_v<T, format::ErrorRecord>) {
          bytes += r.message.capacity();
        }
      },
      record);
  return bytes;
}

std::unique_ptr<TraceSink> TraceSink::Open(const Options& options, const format::FileInfo& info,
                                           std::string* error) {
  format::WriterOptions writer_options;
  writer_options.zstd_level = options.zstd_level;
  auto writer = format::TraceWriter::Open(options.path, info, writer_options);
  if (!writer.ok()) {
    *error = writer.status().message();
    return nullptr;
  }
  return std::unique_ptr<TraceSink>(new TraceSink(options, std::move(writer.value())));
}

TraceSink::TraceSink(const Options& options, std::unique_ptr<format::TraceWriter> writer)
    : options_(options),
      wake_bytes_(std::min(kWakeBytes, std::max<size_t>(options.max_buffered_bytes / 4, 1))),
      writer_(std::move(writer)) {
  thread_ = std::thread([this] { WriterLoop(); });
}

TraceSink::~TraceSink() { Close(); }

TraceSink::PushResult TraceSink::Push(std::vector<format::Record>& records) {
  if (failed()) {
    records.clear();
    return PushResult::kFailed;
  }
  size_t bytes = 0;
  for (const auto& r : records) bytes += ApproxBytes(r);
  std::unique_lock<std::mutex> lock(mu_);
  if (queued_bytes_ + bytes > options_.max_buffered_bytes && queued_bytes_ > 0) {
    if (options_.when_full == WhenFull::kDrop) {
      int64_t now = NowNs();
      if (dropped_records_ == 0) dropped_first_ns_ = now;
      dropped_last_ns_ = now;
      dropped_records_ += records.size();
      dropped_bytes_ += bytes;
      dropped_records_total_.fetch_add(records.size());
      records.clear();
      return PushResult::kDropped;
    }
    has_work_.notify_one();  // The writer may be between polls.
    has_room_.wait(lock, [&] {
      return queued_bytes_ + bytes <= options_.max_buffered_bytes || queued_bytes_ == 0 ||
             failed() || closing_;
    });
    if (failed()) {
      records.clear();
      return PushResult::kFailed;
    }
  }
  if (dropped_records_ > 0) {
    format::DataLossRecord loss;
    loss.records = dropped_records_;
    loss.bytes = dropped_bytes_;
    loss.first_ns = dropped_first_ns_;
    loss.last_ns = dropped_last_ns_;
    loss.reason = "the writer could not keep up (when_full=drop)";
    queue_.emplace_back(std::move(loss));
    dropped_records_ = dropped_bytes_ = 0;
  }
  for (auto& r : records) queue_.push_back(std::move(r));
  records.clear();
  bool wake = queued_bytes_ < wake_bytes_ && queued_bytes_ + bytes >= wake_bytes_;
  queued_bytes_ += bytes;
  lock.unlock();
  if (wake) has_work_.notify_one();
  return PushResult::kQueued;
}

void TraceSink::Fail(const std::string& why) {
  if (failed_.exchange(true)) return;
  std::fprintf(stderr,
               "torchrr: warning: recording stopped: %s; the run goes on without recording\n",
               why.c_str());
  has_room_.notify_all();
}

void TraceSink::WriterLoop() {
  std::vector<format::Record> batch;
  auto last_flush = std::chrono::steady_clock::now();
  for (;;) {
    bool closing;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait_for(lock, kPollInterval,
                         [&] { return queued_bytes_ >= wake_bytes_ || closing_; });
      batch.swap(queue_);
      queued_bytes_ = 0;
      closing = closing_;
    }
    has_room_.notify_all();
    if (!batch.empty() && !failed()) WriteBatch(batch);
    batch.clear();
    auto now = std::chrono::steady_clock::now();
    if (!failed() && now - last_flush >= kFlushInterval) {
      format::Status status = writer_->Flush();
      if (!status.ok()) Fail(status.message());
      last_flush = now;
    }
    if (closing) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
    }
  }
}

bool TraceSink::WriteBatch(std::vector<format::Record>& batch) {
  for (auto& record : batch) {
    if (auto* frame = std::get_if<format::FrameDef>(&record)) {
      if (frame->kind == format::FrameKind::kNative && frame->function == 0 && frame->pc != 0) {
        // A placeholder from the training thread: written as the frames it symbolizes to.
        if (!Symbolize(*frame)) return false;
        continue;
      }
    } else if (auto* stack = std::get_if<format::StackDef>(&record)) {
      std::vector<format::InternId> frames;
      frames.reserve(stack->frames.size());
      for (format::InternId id : stack->frames) {
        auto it = expanded_frames_.find(id);
        if (it == expanded_frames_.end()) {
          frames.push_back(id);
        } else {
          frames.insert(frames.end(), it->second.begin(), it->second.end());
        }
      }
      stack->frames = std::move(frames);
    }
    format::Status status = writer_->Append(record);
    if (!status.ok()) {
      Fail(status.message());
      return false;
    }
  }
  return true;
}

format::InternId TraceSink::InternSymbolString(const std::string& text, bool* ok) {
  if (text.empty()) return 0;
  auto it = symbol_strings_.find(text);
  if (it != symbol_strings_.end()) return it->second;
  format::StringDef def{NextStringId(), text};
  format::Status status = writer_->Append(format::Record(def));
  if (!status.ok()) {
    Fail(status.message());
    *ok = false;
    return 0;
  }
  symbol_strings_.emplace(text, def.id);
  return def.id;
}

bool TraceSink::Symbolize(const format::FrameDef& placeholder) {
  bool ok = true;
  std::vector<format::InternId>& ids = expanded_frames_[placeholder.id];
  for (const SymbolizedFrame& symbols : SymbolizeNativeFrame(placeholder.pc)) {
    format::FrameDef frame;
    frame.id = NextFrameId();
    frame.kind = format::FrameKind::kNative;
    frame.pc = placeholder.pc;
    frame.function = InternSymbolString(symbols.function, &ok);
    frame.file = InternSymbolString(symbols.file, &ok);
    frame.library = InternSymbolString(symbols.library, &ok);
    frame.line = symbols.line;
    frame.framework = symbols.framework;
    if (!ok) return false;
    format::Status status = writer_->Append(format::Record(frame));
    if (!status.ok()) {
      Fail(status.message());
      return false;
    }
    ids.push_back(frame.id);
  }
  return true;
}

bool TraceSink::Close() {
  if (closed_) return !failed();
  closed_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  has_work_.notify_one();
  has_room_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!failed()) {
    format::Status status = writer_->Close();
    if (!status.ok()) Fail(status.message());
  }
  return !failed();
}

}  // namespace torchrr::recorder
