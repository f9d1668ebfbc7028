#include "sink/trace_sink.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "stacks/native_stacks.h"
#include "sink/record_bytes.h"
#include "torchrr/format/source_files.h"

namespace torchrr::recorder {

namespace {

// A chunk is written at least this often while records arrive, so a run killed without warning
// loses at most about this much of its trace.
constexpr auto kFlushInterval = std::chrono::milliseconds(500);
// The writer wakes when this much is queued, or every kPollInterval: waking it per op would cost
// the training thread a futex wake-up and a context switch per op.
constexpr size_t kWakeBytes = 1u << 20;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// Blocks SIGXFSZ on the calling thread while it lives, so that a write past the file-size limit
// (ulimit -f, RLIMIT_FSIZE) fails with EFBIG, and the sink fails with one warning, instead of the
// signal's default action killing the program. The kernel directs that SIGXFSZ at the writing
// thread: one raised while blocked stays pending there and is discarded before the old mask comes
// back, unless one was already pending (then it is not the sink's). Every write of the trace
// happens under one: on the writer thread for its life, and on the thread that opens the sink.
class FileSizeSignalBlocked {
 public:
  FileSizeSignalBlocked() {
    sigemptyset(&file_size_);
    sigaddset(&file_size_, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &file_size_, &old_mask_);
    was_pending_ = Pending();
  }
  ~FileSizeSignalBlocked() {
    if (!was_pending_ && Pending()) {
      const timespec now{0, 0};
      sigtimedwait(&file_size_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  FileSizeSignalBlocked(const FileSizeSignalBlocked&) = delete;
  FileSizeSignalBlocked& operator=(const FileSizeSignalBlocked&) = delete;

 private:
  static bool Pending() {
    sigset_t pending;
    return sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
  }
  sigset_t file_size_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

}  // namespace

std::unique_ptr<TraceSink> TraceSink::Open(const RecorderOptions& options, Pull pull,
                                           const format::FileInfo& info,
                                           std::string* error) {
  format::WriterOptions writer_options;
  writer_options.zstd_level = options.zstd_level;
  writer_options.replace_any_file = options.replace_output;
  FileSizeSignalBlocked blocked;  // Open writes the header and the FileInfo chunk.
  auto writer = format::TraceWriter::Open(options.path, info, writer_options);
  if (!writer.ok()) {
    *error = writer.status().message();
    return nullptr;
  }
  std::unique_ptr<TraceSink> sink(
      new TraceSink(options, std::move(pull), info, std::move(writer.value())));
  struct stat file;
  if (::stat(options.path.c_str(), &file) == 0) {
    sink->file_device_ = file.st_dev;
    sink->file_inode_ = file.st_ino;
  }
  return sink;
}

void TraceSink::CloseInheritedDescriptors() const {
  if (file_inode_ == 0 && spill_prefix_.empty()) return;
  DIR* listing = ::opendir("/proc/self/fd");
  if (listing == nullptr) return;  // No /proc: the child keeps them, as it would have.
  std::vector<int> inherited;
  while (const dirent* entry = ::readdir(listing)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(listing)) continue;
    struct stat file;
    if (::fstat(static_cast<int>(fd), &file) != 0) continue;
    const bool trace = file_inode_ != 0 && file.st_dev == file_device_ &&
                       file.st_ino == file_inode_;
    if (!trace && !IsSpillFile(static_cast<int>(fd))) continue;
    const int flags = ::fcntl(static_cast<int>(fd), F_GETFL);
    if (flags >= 0 && (flags & O_ACCMODE) == O_WRONLY) inherited.push_back(static_cast<int>(fd));
  }
  ::closedir(listing);
  for (int fd : inherited) ::close(fd);
}

namespace {

// SPILL/STEM.step for the trace `path` (STEM: its name without .trr).
std::string SpillPrefix(const RecorderOptions& options) {
  if (options.spill.empty() || options.keep_last == 0) return "";
  std::filesystem::path name = std::filesystem::path(options.path).filename();
  if (name.extension() == ".trr") name.replace_extension();
  // Absolute: a forked child, whose working directory may differ, matches its descriptors' paths
  // against it.
  std::error_code error;
  std::filesystem::path dir = std::filesystem::absolute(options.spill, error);
  if (error) dir = options.spill;
  return (dir.lexically_normal() / name).string() + ".step";
}

}  // namespace

TraceSink::TraceSink(const RecorderOptions& options, Pull pull, const format::FileInfo& info,
                     std::unique_ptr<format::TraceWriter> writer)
    : options_(options),
      pull_(std::move(pull)),
      info_(info),
      spill_prefix_(SpillPrefix(options)),
      wake_bytes_(std::min(kWakeBytes, std::max<size_t>(options.max_buffered_bytes / 4, 1))),
      writer_(std::move(writer)) {
  if (options.keep_last > 0 || options.steps.on()) {
    window_ = std::make_unique<StepWindow>(options.keep_last, options.keep_last_bytes);
    if (options.steps.on()) window_->KeepRange(options.steps.first, options.steps.last);
    spilling_ = !options.steps.on() && !spill_prefix_.empty();
    InstallSignalHandlers();
  }
  StartWriterThread();
}

TraceSink::~TraceSink() { Close(); }

bool TraceSink::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  if (closing_ || failed()) return false;
  const uint64_t ticket = ++flushes_asked_;
  has_work_.notify_one();
  flushed_.wait(lock, [&] { return flushes_done_ >= ticket; });
  return !failed() && !closing_;
}

TraceSink::PushResult TraceSink::Push(const EncodedRecords& records, bool may_wait) {
  if (failed()) return PushResult::kFailed;
  const size_t n_records = records.count();
  const size_t bytes = records.bytes().size();
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.size() + bytes > options_.max_buffered_bytes && !queue_.empty() &&
      (may_wait || options_.when_full == WhenFull::kDrop)) {
    if (options_.when_full == WhenFull::kDrop) {
      int64_t now = NowNs();
      if (dropped_records_ == 0) dropped_first_ns_ = now;
      dropped_last_ns_ = now;
      dropped_records_ += n_records;
      dropped_bytes_ += bytes;
      dropped_records_total_.fetch_add(n_records);
      return PushResult::kDropped;
    }
    has_work_.notify_one();  // The writer may be between polls.
    has_room_.wait(lock, [&] {
      return queue_.size() + bytes <= options_.max_buffered_bytes || queue_.empty() || failed() ||
             closing_;
    });
    if (failed()) return PushResult::kFailed;
  }
  const size_t queued_before = queue_.size();
  if (dropped_records_ > 0) {
    format::DataLossRecord loss;
    loss.records = dropped_records_;
    loss.bytes = dropped_bytes_;
    loss.first_ns = dropped_first_ns_;
    loss.last_ns = dropped_last_ns_;
    loss.reason = "the writer could not keep up (when_full=drop)";
    AppendRecordBytes(loss, queue_);
    dropped_records_ = dropped_bytes_ = 0;
  }
  queue_.Append(records.bytes().data(), bytes);
  bool wake = queued_before < wake_bytes_ && queue_.size() >= wake_bytes_;
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
  FileSizeSignalBlocked blocked;
  ByteBuffer batch;
  auto last_flush = std::chrono::steady_clock::now();
  for (;;) {
    bool closing;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait_for(lock, kPollInterval,
                         [&] {
                           return queue_.size() >= wake_bytes_ || closing_ ||
                                  flushes_asked_ != flushes_done_ || dump_requested_.load();
                         });
    }
    // A fatal signal's handler asks for the trace now: what is queued, then the end. Without the
    // producers' pending records: the signal may have stopped a producer holding them.
    const bool dumping = dump_requested_.load();
    if (pull_ && !dumping) pull_();  // Without mu_: it pushes.
    uint64_t flush_asked;
    bool flush_now;  // A Flush() waits for what was queued before it.
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(queue_);
      closing = closing_;
      flush_asked = flushes_asked_;
      flush_now = flush_asked != flushes_done_;
    }
    has_room_.notify_all();
    if (!batch.empty() && !failed() && !finished_) WriteBatch(batch.view());
    batch.clear();
    auto now = std::chrono::steady_clock::now();
    if (!failed() && !finished_ && (flush_now || now - last_flush >= kFlushInterval)) {
      format::Status status = writer_->Flush();
      if (!status.ok()) Fail(status.message());
      if (spill_) {
        if (format::Status s = spill_->Flush(); !s.ok()) StopSpilling(s.message());
      }
      last_flush = now;
    }
    if (flush_now) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        flushes_done_ = flush_asked;
      }
      flushed_.notify_all();
    }
    if (dumping) break;
    if (closing) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) break;
    }
  }
  // The window if any, the index and the trailer, from this thread like every other write.
  Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    flushes_done_ = flushes_asked_;  // Nothing more will be flushed: no Flush() waits on.
  }
  flushed_.notify_all();
  dump_done_.store(true);  // The handler waits for this; a later signal has nothing to wait for.
}

bool TraceSink::WriteBatch(std::string_view batch) {
  size_t pos = 0;
  while (pos < batch.size()) {
    format::Record* next = reader_.Next(batch, &pos);
    if (next == nullptr) {
      Fail("internal error: a queued record does not decode");
      return false;
    }
    format::Record& record = *next;
    format::InternId source_file = 0;
    uint32_t source_line = 0;
    if (auto* frame = std::get_if<format::FrameDef>(&record)) {
      if (frame->kind == format::FrameKind::kNative && frame->function == 0 && frame->pc != 0) {
        // A placeholder from the training thread: written as the frames it symbolizes to.
        if (!Symbolize(*frame)) return false;
        continue;
      }
      if (!frame->framework) {
        source_file = frame->file;
        source_line = frame->line;
      }
    } else if (auto* string = std::get_if<format::StringDef>(&record)) {
      if (options_.source) string_texts_[string->id] = string->text;
    } else if (auto* stack = std::get_if<format::StackDef>(&record)) {
      expanded_stack_.clear();
      for (format::InternId id : stack->frames) {
        auto it = expanded_frames_.find(id);
        if (it == expanded_frames_.end()) {
          expanded_stack_.push_back(id);
        } else {
          expanded_stack_.insert(expanded_stack_.end(), it->second.begin(), it->second.end());
        }
      }
      stack->frames.swap(expanded_stack_);
    }
    if (!Emit(record)) return false;
    if (source_file != 0 && options_.source) {
      auto path = string_texts_.find(source_file);
      if (path != string_texts_.end() && !WriteSource(source_file, path->second, source_line)) {
        return false;
      }
    }
  }
  return true;
}

bool TraceSink::Emit(const format::Record& record) {
  if (window_) {
    window_->Add(record);
    if (window_->done()) Finish();  // --steps A:B: B is over, the trace is written now.
    if (spilling_ && !finished_) Spill(record);
    return true;
  }
  format::Status status;
  if (const auto* mark = std::get_if<format::StepRecord>(&record)) {
    format::StepRecord numbered = *mark;
    numbered.step = marked_steps_++;
    status = writer_->Append(format::Record(numbered));
  } else {
    status = writer_->Append(record);
  }
  if (!status.ok()) Fail(status.message());
  return status.ok();
}

void TraceSink::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!failed() && window_) {
    format::Status status = window_->WriteTo(*writer_);
    if (!status.ok()) Fail(status.message());
  }
  if (!failed()) {
    format::Status status = writer_->Close();
    if (!status.ok()) Fail(status.message());
  }
  // The window on disk is needed no more once the trace holds it; else it is what is left.
  EndSpill(/*remove=*/!failed());
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
  if (thread_.joinable()) thread_.join();  // It closes the trace last.
  RestoreSignalHandlers();
  return !failed();
}

}  // namespace torchrr::recorder
