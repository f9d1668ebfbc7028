// Value ranges of op tensors, for the first NaN or Inf (RecorderOptions::check_finite).
//
// A NaN or Inf that ends in a loss or a gradient was made by one op, often many ops before anyone
// looks (a trainer logs past it, a GradScaler skips the step). The recorder scans each floating
// output of each recorded op when the op ends (kernels/finite.h), and each input the trace does
// not already describe when it starts, into the op's ValueRanges; the replayer follows the
// non-finite values back to the op that made them.
//
// An input is "already described" when an earlier op's output or input of the same step was that
// tensor at that version: its range is in the trace (a reader looks across the whole step, as a
// nested op ends, and is written, before the op around it). What is known is forgotten at each
// step's start, so that a step kept alone (--keep-last, --steps) carries its own ranges.
//
// CUDA tensors are not scanned yet (their ranges say "not checked"): a per-op scan there must not
// synchronize the host, and its results would come back after the op's record is written.
#ifndef TORCHRR_RECORDER_FINITE_RANGES_H_
#define TORCHRR_RECORDER_FINITE_RANGES_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include "session/thread_state.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

// What a scan of `tensor` finds: flags 0 (not checked) for an undefined tensor, one that is not
// floating point, not on the CPU, without sizes or storage, or whose elements lie outside its
// storage. Reads the elements the view covers, on the calling thread. Never throws.
format::ValueRange ScanTensorRange(const at::Tensor& tensor);

// Thread-safe: the known set has a lock of its own; scans run on the calling thread, outside it.
class FiniteRanges {
 public:
  explicit FiniteRanges(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }

  // At an op's start, once op.inputs holds the inputs' ids and versions: fills op.input_ranges
  // for the inputs not already described (`inputs`: the op's arguments, in the order
  // RecordInputs walked them). Leaves it empty when every input was known or none is floating.
  // Also `spans`, parallel to op.inputs: where each input's elements lie, for ScanOutputs.
  void ScanInputs(c10::ArrayRef<const c10::IValue> inputs, format::OpRecord& op,
                  std::vector<InputSpan>& spans);
  // At an op's end, before its record is made: op.output_ranges, parallel to `outputs` (which
  // RecordOutputs turns into op.outputs, in the same order). An output that is a view into a
  // contiguous input the op did not write, whose range is known and finite, takes that range
  // unscanned: its elements are among the input's (its max_abs is then a bound).
  // `op_name`: an allocation's (aten::empty*) outputs hold whatever the memory held, NaN bit
  // patterns included, until they are written, and a collective's get their bytes at its
  // work's wait(): they are left unchecked (format::HasUnwrittenOutputs), and a reader of them scans what it
  // reads.
  void ScanOutputs(std::string_view op_name, const std::vector<OpOutput>& outputs,
                   const std::vector<InputSpan>& spans, format::OpRecord& op);
  // Once op.outputs holds the outputs' ids and versions: their ranges are described.
  void NoteOutputs(const format::OpRecord& op);
  // A step starts: nothing is described yet. Called for a step the program marks, and by
  // NoteOpStart for the first top-level op after a backward pass (format::StepRule's boundary,
  // give or take the optimizer's ops, whose inputs are then scanned again).
  void ForgetKnown();
  // An op starts (its parent and scope set).
  void NoteOpStart(const format::OpRecord& op) {
    if (op.parent == 0 && op.scope == format::OpScope::kFunction &&
        after_backward_.exchange(false, std::memory_order_relaxed)) {
      ForgetKnown();
    }
  }

 private:
  std::optional<format::ValueRange> ViewRange(const at::Tensor& output,
                                              const std::vector<InputSpan>& spans,
                                              const format::OpRecord& op);
  static uint64_t Key(format::ObjectId tensor, uint32_t version) {
    return tensor * 0x9E3779B97F4A7C15ull ^ version;
  }

  const bool enabled_;
  std::atomic<bool> after_backward_{false};  // A backward function ended since the last forget.
  std::mutex mu_;
  // The ranges described in the step so far, by (tensor, version). Guarded by mu_.
  std::unordered_map<uint64_t, format::ValueRange> known_;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_FINITE_RANGES_H_
