// StepWindow: the last steps of a run, kept in memory by the writer thread (--keep-last N), and
// what they need from before them, written as a trace that replays on its own when the run ends.
//
// Steps. The records between two step boundaries are a step (format/SPEC.md, Steps). A program
// marks its own boundaries with torchrr.step() (a StepRecord with `marked`, which then is the only
// rule; what came before the first mark is no step, and marks are numbered from 0); otherwise a
// step ends where, after a backward pass ran, a top-level forward op starts in grad mode: the step
// is a backward pass, the forward ops before it and what ran after it up to the next forward (the
// optimizer's step, zero_grad, logging). The boundary is put right after the last top-level op
// before that forward op, so that the forward op's records, its start's definitions and nested ops
// included, all begin the next step.
//
// Memory. The open step is kept as record bytes (record_bytes.h), with its index: its definitions
// (interned records, TensorInfos, NodeRecords) and every id it names. A step that ends is kept as
// it is, or compressed (zstd) once the ended steps kept hold kKeepUncompressedBytes. At most
// `keep_steps` steps are kept, the open one included, and the closed ones at most `keep_bytes`
// with their indexes (the oldest go first; the open one always stays). An open step past
// `keep_bytes` uncompressed is ended after its latest top-level op, so that a run whose steps
// never end (no backward pass) stays bounded too.
//
// What a window needs from before it. A step that leaves the window applies its index to the
// "before" state, its ops never decoded again: every StringDef, FrameDef, StackDef and source
// record (kept for good: they grow with the code, not with the run), and the latest TensorInfo of
// each tensor and NodeRecord of each node. A tensor or node that no step has named for
// kForgetAfterSteps steps is forgotten (the activations of steps long gone; swept every
// kForgetAfterSteps steps); one the window still
// names then reads as unknown to the replay. At the end, the window is written after the interned
// definitions and the TensorInfos and NodeRecords it names (and those these name), then each step
// after its StepRecord.
//
// On disk (--spill). A window written with WriteTo while the run goes on, and then followed by
// every later record through AppendFollowing until changes() moves, is a trace of the window as
// it stands: a record that names a tensor or node from before the window that the file does not
// hold yet is preceded by that tensor's or node's latest record.
//
// Writer thread only; not thread-safe.
#ifndef TORCHRR_RECORDER_STEP_WINDOW_H_
#define TORCHRR_RECORDER_STEP_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torchrr/format/record_bytes.h"
#include "torchrr/format/records.h"
#include "torchrr/format/status.h"
#include "torchrr/format/step_rule.h"
#include "torchrr/format/writer.h"

namespace torchrr::recorder {

class StepWindow {
 public:
  // A tensor or node no step named for this many steps is dropped from the "before" state (at
  // the latest twice as many steps later: the state is swept once per kForgetAfterSteps steps).
  static constexpr uint64_t kForgetAfterSteps = 8;
  // Ended steps are kept as they are while they hold less than this together (and less than
  // keep_bytes), compressed past it: zstd costs the writer thread about a millisecond per MB at
  // the step's end and again when it leaves the window, which a window of a few small steps does
  // not need to pay.
  static constexpr size_t kKeepUncompressedBytes = size_t{64} << 20;

  StepWindow(size_t keep_steps, size_t keep_bytes);
  // --steps A:B: keeps steps first to last (inclusive) rather than the last keep_steps; steps
  // before first are applied to the "before" state, and once a step after last begins, done()
  // turns true and Add() ignores everything.
  static constexpr uint64_t kNoLast = UINT64_MAX;
  void KeepRange(uint64_t first, uint64_t last);
  bool done() const { return done_; }

  // Every record the trace would hold, in order.
  void Add(const format::Record& record);

  // Writes what the kept steps need, then the kept steps, into `writer`. With `carried`, adds
  // the ids of the tensors and nodes written from before the window to it, and writes the open
  // step's StepRecord even when the step holds no record yet (records will follow it).
  format::Status WriteTo(format::TraceWriter& writer,
                         std::set<format::ObjectId>* carried = nullptr);
  // After WriteTo(writer, carried), the record that Add() just took: first the latest record of
  // each tensor and node from before the window that it names and `carried` lacks (then added to
  // it), then the record itself. StepRecords are left out: WriteTo writes the steps' marks, and
  // a mark that begins a step moves changes().
  format::Status AppendFollowing(const format::Record& record, format::TraceWriter& writer,
                                 std::set<format::ObjectId>* carried);
  // Moves each time the kept steps change other than by a record added to the open step: a step
  // ended (the oldest may have gone), or the program's first mark renumbered them. A window
  // written before and followed since is stale once it moved.
  uint64_t changes() const { return changes_; }

  // Steps seen so far (the open one included), and those kept.
  uint64_t steps_seen() const { return next_step_; }
  size_t steps_kept() const { return closed_.size() + (open_kept() ? 1 : 0); }

 private:
  // What a step gives the state before the window when it leaves it, and the window when it is
  // written, kept beside its records so that neither decodes them: its definitions (interned,
  // TensorInfo, NodeRecord) as record bytes, and every object id its records name, in order.
  struct StepIndex {
    format::ByteBuffer definitions;
    std::vector<format::ObjectId> named;
    size_t bytes() const { return definitions.size() + named.size() * sizeof(format::ObjectId); }
  };
  struct ClosedStep {
    format::StepRecord mark;
    std::string bytes;  // zstd-compressed; the record bytes themselves when `stored`.
    size_t raw_bytes = 0;
    bool stored = false;
    StepIndex index;
    size_t held_bytes = 0;  // bytes and index: what counts against keep_bytes.
  };
  // A place in the open step: its bytes, and its index's, up to there.
  struct Cut {
    size_t bytes = 0;
    size_t definitions = 0;
    size_t named = 0;
  };
  template <class T>
  struct Dated {
    T record;
    uint64_t last_step = 0;  // The last step that named it.
  };

  Cut Whole() const {
    return {open_.size(), open_index_.definitions.size(), open_index_.named.size()};
  }
  void CloseStepAt(Cut cut);
  void KeepOutsideError(const format::ErrorRecord& error);
  // Writes the latest records of the tensors and nodes in `ids` from before the window, and
  // those they name, that `carried` lacks, adding them to it.
  format::Status WriteCarried(std::vector<format::ObjectId> ids, format::TraceWriter& writer,
                              std::set<format::ObjectId>* carried);
  bool open_kept() const { return !done_ && (!ranged_ || open_mark_.step >= range_first_); }
  void Evict();
  void ApplyToBefore(const StepIndex& index, uint64_t step);
  // False (and `out` the bytes themselves) when zstd failed.
  static bool Compress(std::string_view bytes, std::string* out);
  // The step's record bytes: `bytes` itself when stored, else decompressed into `scratch`; empty
  // (with `ok` false) when zstd fails.
  static std::string_view Records(const ClosedStep& step, std::string* scratch, bool* ok);

  const size_t keep_steps_;
  const size_t keep_bytes_;

  // The open step.
  format::StepRecord open_mark_;
  format::ByteBuffer open_;
  StepIndex open_index_;
  Cut boundary_;                 // Where the open step would end: after its last top-level op.
  format::StepRule step_rule_;   // Where steps begin while the program marks none.
  bool marked_ = false;          // The program marks its steps: no boundary is found.
  bool ranged_ = false;          // KeepRange: steps range_first_ to range_last_.
  uint64_t range_first_ = 0;
  uint64_t range_last_ = kNoLast;
  bool done_ = false;            // A step past range_last_ began.
  uint64_t next_step_ = 1;       // The open step is next_step_ - 1.
  // The program's own errors (not an op's C++ exception) raised in a step before the range
  // (--steps A:B), each after the StringDef of its type when that step defined it: written after
  // the kept steps, named by no op or stack (their records are not kept), so that a trace of a
  // range the run never reached still says how the run ended. The last few only.
  static constexpr size_t kMaxOutsideErrors = 4;
  std::deque<std::vector<format::Record>> outside_errors_;
  uint64_t changes_ = 0;

  std::deque<ClosedStep> closed_;  // Oldest first.
  size_t closed_bytes_ = 0;

  // The state before the oldest kept step.
  std::vector<format::Record> interned_;  // StringDef, FrameDef, StackDef, SourceFile/Lines.
  std::unordered_map<format::ObjectId, Dated<format::TensorInfo>> tensors_;
  std::unordered_map<format::ObjectId, Dated<format::NodeRecord>> nodes_;
  uint64_t next_sweep_ = 0;  // The step whose leaving sweeps tensors_ and nodes_ next.
  format::RecordBytesReader reader_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_STEP_WINDOW_H_
