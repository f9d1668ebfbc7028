// torchrr's recorder: the whole public C++ API.
//
// A Recorder records every tensor op autograd sees in the process (forward, backward, optimizer, on
// every thread; see RecorderOptions::all_ops for the others) into a torchrr trace, from
// its construction to its destruction (or Stop()). It attaches through libtorch's RecordFunction
// callbacks and never breaks or changes the run it records: every failure inside it (an
// unwritable path, a full disk, an internal error) prints one warning on stderr and stops the
// recording, and the training goes on with identical results.
//
// At most one Recorder records at a time in a process; constructing a second one while the first
// records prints a warning and the second records nothing.
//
//   torchrr::RecorderOptions options;
//   options.path = "step.trr";
//   torchrr::Recorder recorder(options);   // Records from here...
//   loss.backward();
//   // ...to the end of the scope.
#ifndef TORCHRR_RECORDER_H_
#define TORCHRR_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace torchrr {

enum class WhenFull {
  kWait,  // The training thread waits for the writer thread (no data lost). The default.
  kDrop,  // Records are dropped and a data-loss record says how many.
};

// Steps first to last, inclusive and 0-based (last UINT64_MAX: to the end); off while
// first > last, as by default.
struct StepRange {
  uint64_t first = 1;
  uint64_t last = 0;
  bool on() const { return first <= last; }
  bool operator==(const StepRange&) const = default;
};

// What to record and how. Besides the trace's path, the rank and the compression level, the
// options are those of recording_options.def, which says what each one does, its default, and
// its names on the command line, in the environment and in Python.
struct RecorderOptions {
  std::string path = "torchrr.trr";
  int rank = -1;                 // Distributed rank written to the file header; -1 reads RANK.
  int zstd_level = 1;           // Level 1: on trace data it compresses better than 3, and faster.
#define TORCHRR_OPTION(type, field, default_value, ...) type field = default_value;
#include "torchrr/recording_options.def"
#undef TORCHRR_OPTION
};

class Recorder {
 public:
  explicit Recorder(RecorderOptions options = {});
  ~Recorder();  // Stop().
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Stops recording, symbolizes stacks, writes everything buffered and closes the trace.
  // Idempotent; safe to call from any thread.
  void Stop();

  // True while this recorder records (false after Stop() or after it degraded).
  bool recording() const;

  // Records an error message into the trace (for example the what() of an exception the caller
  // caught from backward()), so the replay can quote it. Thread-safe; a no-op when not recording.
  void RecordError(const std::string& type, const std::string& message);

  // Marks the start of a training step (call it where each step begins). From the first call on,
  // the program's marks are the only step boundaries (RecorderOptions::keep_last and the
  // trace's StepRecords); without any, the recorder finds the steps itself. Thread-safe.
  void Step();

  // Hands what was recorded so far to the writer thread and returns once it is in the trace
  // file on disk (written and flushed; with keep_last, in the spill file when there is one: the
  // kept steps themselves are written when the recording stops), as the writer does on its own
  // every 0.5 s. For a program about to take a risk (a test that kills itself, a step that may
  // be OOM-killed). Returns false when not recording or the trace could not be written.
  // Thread-safe; blocks the caller, never the other threads.
  bool Flush();

  // Counts so far. Thread-safe.
  uint64_t ops_recorded() const;
  uint64_t records_dropped() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchrr

#endif  // TORCHRR_RECORDER_H_
