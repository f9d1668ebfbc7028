// TraceSink: the bounded queue between the training threads and the writer thread.
//
// Training threads hand over groups of records (one op's worth), appended to the queue as bytes
// (record_bytes.h), and go back to work; the writer thread decodes them, symbolizes new native
// frames, encodes them in the trace format, compresses and writes. The queue holds at most
// max_buffered_bytes: when it is full a producer either waits for the writer (kWait, no data lost)
// or drops the group and counts it (kDrop); the count becomes a DataLossRecord in the trace.
// A write that fails (disk full, path gone, past the file-size limit) prints one warning and fails
// the sink: every later Push() returns false and the recorder stops recording. The training run is
// never interrupted: SIGXFSZ is blocked wherever the trace is written (Open's header on the
// caller's thread, everything after on the writer thread), so the limit fails the write instead.
#ifndef TORCHRR_RECORDER_TRACE_SINK_H_
#define TORCHRR_RECORDER_TRACE_SINK_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sys/types.h>

#include "sink/record_bytes.h"
#include "sink/step_window.h"
#include "torchrr/format/records.h"
#include "torchrr/format/writer.h"
#include "torchrr/recorder.h"

namespace torchrr::recorder {

class TraceSink {
 public:
  // Called by the writer thread before each look at the queue, without the sink's lock: the
  // producer pushes what it holds back (Push with may_wait false). Must not block.
  using Pull = std::function<void()>;

  // Opens the trace file at options.path and starts the writer thread. The sink reads these of
  // `options`, which must outlive it: max_buffered_bytes and when_full (the queue), zstd_level,
  // source (the lines around each user frame's line, FrameDef.framework false, with each file's
  // hash: SourceFile, SourceLines, read by the writer thread when a frame is first written),
  // keep_last, keep_last_bytes and steps (the StepWindow, written at Close(), or when SIGTERM,
  // SIGINT or SIGABRT is about to end the process: handlers installed while the sink lives, for
  // the signals whose action was the default), and spill: with keep_last, one trace file in the
  // directory, named after `path` and the step under way (run.step00000900.trr for run.trr),
  // holds the window as it stands: when a step ends, the window is written into a new file,
  // which then follows each record as it comes (flushed as the trace is), and the previous file
  // is removed. At the end the trace is written to `path` as without it and the file there is
  // removed; it stays when the trace could not be written. A file that cannot be written prints
  // one warning and stops the spilling, not the recording.
  // On failure returns nullptr and sets *error.
  static std::unique_ptr<TraceSink> Open(const RecorderOptions& options, Pull pull,
                                         const format::FileInfo& info, std::string* error);
  ~TraceSink();  // Close().

  enum class PushResult { kQueued, kDropped, kFailed };
  // Appends `records` (groups: each is written whole) to the queue. Thread-safe.
  // kDropped: the queue was full in kDrop mode and the records were counted as lost (the caller
  // must forget what it interned in them). kFailed: the sink has failed; stop recording.
  // may_wait false (the writer thread's pull): never waits for room in kWait mode, the records
  // go over the bound instead.
  PushResult Push(const EncodedRecords& records, bool may_wait = true);

  // Waits until the writer thread has written what is queued now and flushed the trace file
  // (and the spill file). False when the sink failed or is closing. Thread-safe.
  bool Flush();

  // Drains the queue and joins the writer thread, which closes the trace (index and trailer).
  // Idempotent. Returns false if the trace could not be written whole.
  bool Close();

  // In a process forked from the one that opened the sink: closes the descriptors it inherited
  // onto the trace file, write-only ones (the sink's), so that it does not keep the file open,
  // and the lock on it held, after the sink closes it. Touches nothing else of the sink's (its
  // writer thread is not in the child), which the child must never use afterwards.
  void CloseInheritedDescriptors() const;

  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  uint64_t dropped_records() const { return dropped_records_total_.load(); }

  // String ids come from one counter shared by the recorder and the writer thread (which interns
  // the names it finds when symbolizing). Thread-safe.
  format::InternId NextStringId() { return next_string_id_.fetch_add(1) + 1; }
  // Frame ids likewise. A native FrameDef the recorder queues with only `pc` set is a
  // placeholder: the writer thread symbolizes it into the frames it stands for (several when
  // functions were inlined there), writes those under fresh ids, and rewrites the StackDefs that
  // name the placeholder to name them instead.
  format::InternId NextFrameId() { return next_frame_id_.fetch_add(1) + 1; }

 private:
  TraceSink(const RecorderOptions& options, Pull pull, const format::FileInfo& info,
            std::unique_ptr<format::TraceWriter> writer);
  void WriterLoop();
  bool WriteBatch(std::string_view batch);  // Writer thread only.
  void Fail(const std::string& why);
  // Writes the frames a placeholder symbolizes to, with the StringDefs they need first.
  // Writer thread only.
  bool Symbolize(const format::FrameDef& placeholder);
  format::InternId InternSymbolString(const std::string& text, bool* ok);
  // With options.source: the lines of `path` (StringDef `file`) around `line` that the trace does
  // not hold yet, and the file's SourceFile first. False when the sink failed. Writer thread only.
  bool WriteSource(format::InternId file, const std::string& path, uint32_t line);
  // Hands a record to the trace: the file, or the step window. False when the sink failed.
  bool Emit(const format::Record& record);
  // The end of the trace: the window (if any), then the index and the trailer.
  void Finish();
  // --spill: the window into a new file in the spill directory (the previous one removed), or
  // the record that the window just took after it. A failure stops the spilling. Writer thread
  // only.
  void Spill(const format::Record& record);
  void RotateSpill();
  void StopSpilling(const std::string& why);
  // Closes the file in the spill directory, removing it when `remove`. Writer thread only.
  void EndSpill(bool remove);
  // Whether the descriptor `fd` is open onto a spill file (CloseInheritedDescriptors).
  bool IsSpillFile(int fd) const;
  static void OnFatalSignal(int signal);
  void InstallSignalHandlers();
  void RestoreSignalHandlers();
  // Starts the writer thread with SIGTERM, SIGINT and SIGABRT blocked: the kernel gives a signal
  // sent to the process to a thread that does not block it, and OnFatalSignal run on the writer
  // thread would wait for the window that only that thread writes.
  void StartWriterThread();

  // A source file as the writer thread read it.
  struct Source {
    bool readable = false;
    format::InternId file = 0;        // The StringDef id the first frame named it by.
    std::string bytes;
    std::vector<std::string_view> lines;  // Into bytes.
    std::vector<bool> written;            // Per line: already in the trace.
  };

  const RecorderOptions& options_;  // The session's.
  const Pull pull_;
  const format::FileInfo info_;     // The spill files' too.
  const std::string spill_prefix_;  // SPILL/STEM.step: what the spill files' paths begin with.
  const size_t wake_bytes_;  // Queued bytes that wake the writer before its next poll.
  // The trace file as Open found it (no inode 0: unknown).
  dev_t file_device_ = 0;
  ino_t file_inode_ = 0;
  std::unique_ptr<format::TraceWriter> writer_;  // Writer thread only.

  std::mutex mu_;
  std::condition_variable has_work_;   // Writer waits on it.
  std::condition_variable has_room_;   // Producers wait on it (kWait).
  ByteBuffer queue_;                   // Guarded by mu_: AppendRecordBytes' bytes.
  bool closing_ = false;               // Guarded by mu_.
  // Flush(): the flushes asked for and those done, counted. Guarded by mu_.
  uint64_t flushes_asked_ = 0;
  uint64_t flushes_done_ = 0;
  std::condition_variable flushed_;    // Flush() waits on it.
  uint64_t dropped_records_ = 0;       // Guarded by mu_: not yet reported in the trace.
  uint64_t dropped_bytes_ = 0;         // Guarded by mu_.
  int64_t dropped_first_ns_ = 0;       // Guarded by mu_.
  int64_t dropped_last_ns_ = 0;        // Guarded by mu_.

  RecordBytesReader reader_;                                          // Writer thread only.
  std::vector<format::InternId> expanded_stack_;                      // Writer thread only.
  std::unordered_map<std::string, format::InternId> symbol_strings_;  // Writer thread only.
  std::unordered_map<format::InternId, std::vector<format::InternId>> expanded_frames_;  // Writer.
  // With options.source, writer thread only: the queued StringDefs' texts (a Python frame names
  // its file by id), and the files read, by path.
  std::unordered_map<format::InternId, std::string> string_texts_;
  std::unordered_map<std::string, Source> sources_;
  size_t source_bytes_read_ = 0;     // Of the files read.
  size_t source_bytes_written_ = 0;  // Of the lines written.
  std::unique_ptr<StepWindow> window_;  // Writer thread only; keep_last or steps.
  uint64_t marked_steps_ = 0;           // StepRecords the program marked (writer thread).
  // --spill, writer thread only: the file, its path, the ids it carries from before the window,
  // and the window's changes() it was written at.
  std::unique_ptr<format::TraceWriter> spill_;
  std::string spill_path_;
  std::set<format::ObjectId> spill_carried_;
  uint64_t spill_changes_ = 0;
  bool spilling_ = false;
  // A fatal signal's handler asks the writer thread to write the window now, and waits for it.
  std::atomic<bool> dump_requested_{false};
  std::atomic<bool> dump_done_{false};
  bool finished_ = false;               // Writer thread: Finish() ran.
  bool handlers_installed_ = false;
  std::atomic<format::InternId> next_string_id_{0};
  std::atomic<format::InternId> next_frame_id_{0};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> dropped_records_total_{0};
  std::thread thread_;
  bool closed_ = false;                // Close() caller only.
};

// Steady-clock nanoseconds, the trace's clock.
int64_t NowNs();

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_TRACE_SINK_H_
