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

struct RecorderOptions {
  std::string path = "torchrr.trr";
  bool native_stacks = true;     // A C++ stack per top-level op, symbolized at close.
  bool python_stacks = true;     // Python frames per op, when the process runs Python.
  size_t max_buffered_bytes = 256u << 20;  // Records waiting for the writer thread, at most.
  WhenFull when_full = WhenFull::kWait;
  int rank = -1;                 // Distributed rank written to the file header; -1 reads RANK.
  int zstd_level = 1;           // Level 1: on trace data it compresses better than 3, and faster.
  // Fingerprints (a 64-bit hash) of the bytes of every saved tensor when its node saves it and
  // again when backward is about to use it, so the replay can report writes that no version
  // counter saw (raw CUDA kernels, numpy, extensions) as `silent` violations. Costs a pass over
  // every saved tensor's bytes twice (and, on CUDA, a stream synchronization each time).
  bool verify_saved = false;
  // CUDA kernels, copies and memsets through CUPTI, each attributed to the op that launched it;
  // only when a CUDA device is present. When CUPTI is missing or refuses: one warning, and the
  // recording goes on without them.
  bool cuda_kernels = true;
  // Also the ops folded by default into the op they run in (SPEC.md, Which ops): ops that create
  // no autograd node and bump no version counter, run inside a recorded op or backward function.
  // Those are the ops a kernel runs below autograd (an `aten::_to_copy` kernel's
  // `aten::empty_strided` and `aten::copy_`: the version of an in-place op's self is bumped once,
  // by the op the program called) and the ops of a backward formula (grad mode off) that write
  // none of their arguments (`MmBackward0`'s `aten::mm`s). The enclosing op stands for them, and
  // for their CUDA kernels. Off by default: they are about 60% of a training step's ops. On with
  // verify_saved, whose writes that no counter sees may come from such an op.
  bool all_ops = false;
  // A process forked from the recording one (os.fork, DataLoader workers with the fork start
  // method) records into a trace of its own, FILE.pidN.EXT beside this one (EXT: the path's, or
  // .trr), from its first op to its exit. Off: a forked child records nothing. Either way the child
  // never writes to this process's trace. A child's recording has no CUDA kernels (CUDA does not
  // survive a fork) and no C++ stacks (the symbolizer's locks may be held by this process's
  // writer thread at the instant of the fork). It is closed at exit (atexit), or by the end of a
  // multiprocessing child (torchrr's Python package hooks it, as those end with os._exit); a
  // child that ends otherwise leaves a trace cut after its last whole chunk.
  bool follow_forks = false;
  // The source lines around every user frame the trace's stacks name (not torch's, site-packages'
  // or the standard library's; a C++ program's own files), with a hash of each file, so the trace
  // replays with its code on a machine without the sources. Read by the writer thread, off the
  // training threads, when a frame is first written.
  bool source = true;
  // Keep only the last N steps of the run (0: every record, written as it comes). The steps are
  // kept in memory, compressed, at most keep_last_bytes of them (the oldest go first; the step
  // under way always stays), and written when the recording stops: at exit, at an uncaught
  // exception, or when SIGTERM, SIGINT or SIGABRT (whose action was the default) ends the process.
  // A process killed outright (SIGKILL, the OOM killer) loses them, unless spill_dir is set.
  // Steps: format/SPEC.md, Steps.
  size_t keep_last_steps = 0;
  size_t keep_last_bytes = size_t{1} << 30;
  // With keep_last_steps: the kept steps are also kept on disk in this directory (which must
  // exist), in one trace file named after `path` and the step under way (run.step00000900.trr for
  // run.trr), rewritten as each step ends and followed as records come, so that a process killed
  // outright leaves its last steps there (all but about the last half second). Removed when the
  // trace at `path` is written. Empty: in memory only.
  std::string spill_dir;
  // Keep steps steps_first to steps_last (inclusive, 0-based; UINT64_MAX: to the end) instead:
  // the earlier ones feed only what the kept ones need, and the trace is written as soon as a step
  // after steps_last begins (the run goes on, recorded but not written). Off while steps_first >
  // steps_last (the default). At most keep_last_bytes of steps, compressed, the oldest dropped.
  uint64_t steps_first = 1;
  uint64_t steps_last = 0;
  // For tests of what a stopped recording looks like: the end of the Nth recorded op fails as an
  // internal error would, and the recording stops there (the trace says why). 0: never.
  uint64_t fail_at_op = 0;
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
  // the program's marks are the only step boundaries (RecorderOptions::keep_last_steps and the
  // trace's StepRecords); without any, the recorder finds the steps itself. Thread-safe.
  void Step();

  // Counts so far. Thread-safe.
  uint64_t ops_recorded() const;
  uint64_t records_dropped() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchrr

#endif  // TORCHRR_RECORDER_H_
