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

// Source context: the lines before and after a frame's line that the trace carries.
constexpr uint32_t kSourceContextLines = 3;
// Bounds on what source costs: the files read (kept for the run: each frame's lines are cut from
// them when first seen), the lines written, and the longest line written (a minified or generated
// file's). A line past them is not written: the replay reads it from its own machine's file, when
// that is the same file.
constexpr size_t kMaxSourceBytesRead = 64u << 20;
constexpr size_t kMaxSourceBytesWritten = 16u << 20;
constexpr size_t kMaxSourceLineBytes = 16u << 10;

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
  FileSizeSignalBlocked blocked;  // Open writes the header and the FileInfo chunk.
  auto writer = format::TraceWriter::Open(options.path, info, writer_options);
  if (!writer.ok()) {
    *error = writer.status().message();
    return nullptr;
  }
  std::unique_ptr<TraceSink> sink(new TraceSink(options, std::move(pull), info, std::move(writer.value())));
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
  thread_ = std::thread([this] { WriterLoop(); });
}

TraceSink::~TraceSink() { Close(); }

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
                                  dump_requested_.load();
                         });
    }
    // A fatal signal's handler asks for the trace now: what is queued, then the end. Without the
    // producers' pending records: the signal may have stopped a producer holding them.
    const bool dumping = dump_requested_.load();
    if (pull_ && !dumping) pull_();  // Without mu_: it pushes.
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(queue_);
      closing = closing_;
    }
    has_room_.notify_all();
    if (!batch.empty() && !failed() && !finished_) WriteBatch(batch.view());
    batch.clear();
    auto now = std::chrono::steady_clock::now();
    if (!failed() && !finished_ && now - last_flush >= kFlushInterval) {
      format::Status status = writer_->Flush();
      if (!status.ok()) Fail(status.message());
      if (spill_) {
        if (format::Status s = spill_->Flush(); !s.ok()) StopSpilling(s.message());
      }
      last_flush = now;
    }
    if (dumping) break;
    if (closing) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) break;
    }
  }
  // The window if any, the index and the trailer, from this thread like every other write.
  Finish();
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

void TraceSink::Spill(const format::Record& record) {
  if (!spill_ || window_->changes() != spill_changes_) {
    RotateSpill();
    return;
  }
  format::Status status = window_->AppendFollowing(record, *spill_, &spill_carried_);
  if (!status.ok()) StopSpilling(status.message());
}

void TraceSink::RotateSpill() {
  char step[32];
  std::snprintf(step, sizeof step, "%08llu.trr",
                static_cast<unsigned long long>(window_->steps_seen() - 1));
  const std::string path = spill_prefix_ + step;
  if (path == spill_path_) EndSpill(/*remove=*/true);  // Renumbered by the first mark.
  format::WriterOptions writer_options;
  writer_options.zstd_level = options_.zstd_level;
  auto opened = format::TraceWriter::Open(path, info_, writer_options);
  if (!opened.ok()) {
    StopSpilling(opened.status().message());
    return;
  }
  std::unique_ptr<format::TraceWriter> next = std::move(opened.value());
  std::set<format::ObjectId> carried;
  format::Status status = window_->WriteTo(*next, &carried);
  if (status.ok()) status = next->Flush();
  if (!status.ok()) {
    next.reset();
    ::unlink(path.c_str());
    StopSpilling(status.message());
    return;
  }
  EndSpill(/*remove=*/true);
  spill_ = std::move(next);
  spill_path_ = path;
  spill_carried_ = std::move(carried);
  spill_changes_ = window_->changes();
}

void TraceSink::StopSpilling(const std::string& why) {
  if (!spilling_) return;
  spilling_ = false;
  std::fprintf(stderr,
               "torchrr: warning: --spill stopped: %s; the last steps are kept in memory only\n",
               why.c_str());
  EndSpill(/*remove=*/true);  // An older window than the run's would mislead after a kill.
}

void TraceSink::EndSpill(bool remove) {
  if (!spill_) return;
  // A file that does not close whole is kept all the same when it is to be kept (the trace at
  // `path` failed): its flushed chunks are then the only copy of the window, and read as a trace
  // cut short.
  (void)spill_->Close();
  spill_.reset();
  if (remove) ::unlink(spill_path_.c_str());
  spill_path_.clear();
  spill_carried_.clear();
}

bool TraceSink::IsSpillFile(int fd) const {
  if (spill_prefix_.empty()) return false;
  char target[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::string_view(target, n).starts_with(spill_prefix_);
}

namespace {

// The sink whose window a fatal signal writes; one at a time (the process's recording).
std::atomic<TraceSink*> g_window_sink{nullptr};
constexpr int kWindowSignals[] = {SIGTERM, SIGINT, SIGABRT};
struct sigaction g_previous_actions[3];
// How long a fatal signal waits for the window to be written before the process goes on dying.
constexpr int kDumpWaitMs = 10000;

}  // namespace

void TraceSink::OnFatalSignal(int signal) {
  const int saved_errno = errno;
  if (TraceSink* sink = g_window_sink.exchange(nullptr)) {
    sink->dump_requested_.store(true);
    const timespec tick{0, 10 * 1000 * 1000};
    for (int waited = 0; waited < kDumpWaitMs && !sink->dump_done_.load(); waited += 10) {
      nanosleep(&tick, nullptr);
    }
  }
  // The action the program had (the default: end the process), as if torchrr were not there.
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    if (kWindowSignals[i] == signal) sigaction(signal, &g_previous_actions[i], nullptr);
  }
  errno = saved_errno;
  raise(signal);
}

void TraceSink::InstallSignalHandlers() {
  TraceSink* expected = nullptr;
  if (!g_window_sink.compare_exchange_strong(expected, this)) return;  // Another sink has them.
  handlers_installed_ = true;
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    struct sigaction current {};
    if (sigaction(kWindowSignals[i], nullptr, &current) != 0) continue;
    g_previous_actions[i] = current;
    // Only where the signal would end the process with no handler of the program's (Python's
    // SIGINT handler raises KeyboardInterrupt, and the trace is closed at exit as usual).
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
      struct sigaction action {};
      action.sa_handler = &TraceSink::OnFatalSignal;
      sigemptyset(&action.sa_mask);
      sigaction(kWindowSignals[i], &action, nullptr);
    }
  }
}

void TraceSink::RestoreSignalHandlers() {
  if (!handlers_installed_) return;
  handlers_installed_ = false;
  TraceSink* self = this;
  g_window_sink.compare_exchange_strong(self, nullptr);
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    struct sigaction current {};
    if (sigaction(kWindowSignals[i], nullptr, &current) == 0 &&
        !(current.sa_flags & SA_SIGINFO) && current.sa_handler == &TraceSink::OnFatalSignal) {
      sigaction(kWindowSignals[i], &g_previous_actions[i], nullptr);
    }
  }
}

bool TraceSink::WriteSource(format::InternId file, const std::string& path, uint32_t line) {
  if (!options_.source || file == 0 || line == 0 || path.empty()) return true;
  auto [it, first_seen] = sources_.try_emplace(path);
  Source& source = it->second;
  if (first_seen) {
    if (path.front() == '<' || source_bytes_read_ >= kMaxSourceBytesRead) return true;
    std::optional<std::string> bytes = format::ReadSourceFile(
        path, std::min(format::kMaxSourceBytes, kMaxSourceBytesRead - source_bytes_read_));
    if (!bytes) return true;  // "<stdin>", a file gone or unreadable: the trace has no code.
    source_bytes_read_ += bytes->size();
    source.readable = true;
    source.file = file;
    source.bytes = std::move(*bytes);
    source.lines = format::SplitSourceLines(source.bytes);
    source.written.assign(source.lines.size(), false);
    format::SourceFile def;
    def.file = file;
    def.hash = format::SourceHash(source.bytes);
    def.bytes = source.bytes.size();
    def.lines = static_cast<uint32_t>(source.lines.size());
    if (!Emit(format::Record(def))) return false;
  }
  if (!source.readable || line > source.lines.size()) return true;
  // The lines around `line` not yet written, in runs of consecutive ones.
  const uint32_t first = line > kSourceContextLines ? line - kSourceContextLines : 1;
  const uint32_t last = std::min<uint32_t>(line + kSourceContextLines,
                                           static_cast<uint32_t>(source.lines.size()));
  format::SourceLines run;
  run.file = source.file;
  auto flush = [&] {
    if (run.text.empty()) return true;
    bool ok = Emit(format::Record(run));
    run.text.clear();
    return ok;
  };
  for (uint32_t n = first; n <= last; ++n) {
    std::string_view text = source.lines[n - 1];
    const bool take = !source.written[n - 1] && text.size() <= kMaxSourceLineBytes &&
                      source_bytes_written_ + text.size() <= kMaxSourceBytesWritten;
    if (!take) {
      if (!flush()) return false;
      continue;
    }
    if (run.text.empty()) run.first_line = n;
    run.text.emplace_back(text);
    source.written[n - 1] = true;
    source_bytes_written_ += text.size();
  }
  return flush();
}

format::InternId TraceSink::InternSymbolString(const std::string& text, bool* ok) {
  if (text.empty()) return 0;
  auto it = symbol_strings_.find(text);
  if (it != symbol_strings_.end()) return it->second;
  format::StringDef def{NextStringId(), text};
  if (!Emit(format::Record(def))) {
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
    if (!Emit(format::Record(frame))) return false;
    if (!frame.framework && !WriteSource(frame.file, symbols.file, frame.line)) return false;
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
  if (thread_.joinable()) thread_.join();  // It closes the trace last.
  RestoreSignalHandlers();
  return !failed();
}

}  // namespace torchrr::recorder
