// NonFiniteWatch: where the first NaN or Inf that mattered came from.
//
// A NaN loss or a gradient that overflowed is seen steps after, and far from, the op that made
// it: every op after it carries it on. The recorder writes, per op, whether each floating output
// held a NaN or an Inf and its largest finite magnitude, and the same for inputs it had not seen
// as an earlier op's output (format 1.16, OpRecord.input_ranges/output_ranges). This watch keeps
// the non-finite values by (tensor, version) and their producers, and at Finish follows them back
// from what they reached:
//   - a backward op's output (a gradient), or a write into a parameter (an optimizer's update);
//   - a forward value no later op read (the loss, or what was logged of it).
// A NaN is followed through the inputs that held a NaN; an Inf through those that held an Inf;
// a NaN made from infinities (inf - inf, a softmax over a row of -inf) through the Inf to where it
// was made, unless it was written on purpose (a -inf mask: a fill or full with an infinite value,
// or an input that came in with it), where the op that made the NaN is the origin. Values that a
// masked fill, a torch.where or nan_to_num removed reach nothing, and are not followed. Steps in
// which a GradScaler found non-finite gradients (and so skipped its optimizer step) are counted,
// not reported, unless a weight went non-finite.
//
// Not thread-safe; writes AnalysisState::non_finite, scaler_skipped_steps and ranges_recorded.
#ifndef TORCHRR_REPLAYER_SRC_NON_FINITE_H_
#define TORCHRR_REPLAYER_SRC_NON_FINITE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "analysis_state.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer {

// What to change for a first NaN or Inf of `cause`, one sentence.
std::string NonFiniteHelp(NonFiniteCause cause);
// The largest finite value of a floating dtype (65504 for float16); 0 for another dtype.
double DTypeMax(format::DType dtype);

class NonFiniteWatch {
 public:
  explicit NonFiniteWatch(AnalysisState& state) : state_(state) {}

  // Every op, after the analysis recorded it; `step` and `marked_step` as the analysis counts
  // them (by its own rule, and by the program's StepRecords).
  void OnOp(const format::OpRecord& r, uint64_t step, uint64_t marked_step);
  void OnNodeExec(const format::NodeExecRecord& r);
  // The trace ended: resolves the first NaN or Inf into AnalysisState::non_finite.
  void Finish();

 private:
  // A value as a range recorded it: its flags and largest finite magnitude, the op that made it
  // (index + 1 in ops_ when it is non-finite, else 0) and, for one that came in as an input, the
  // first op that read it.
  struct Value {
    uint8_t flags = 0;
    float max_abs = 0;
    uint32_t producer = 0;
    bool consumed = false;
    format::ObjectId reader = 0;
    // Its first reader also wrote it (an out= or in-place destination, a collective's buffer):
    // what it held before may be memory never written, not data.
    bool overwritten = false;
  };
  // A forward or optimizer op with a non-finite output.
  struct Op {
    format::ObjectId op = 0;
    format::InternId name = 0;
    uint64_t order = 0;  // Among all ops, in trace order.
    uint64_t step = 0;
    uint64_t marked_step = 0;
    bool writes_parameter = false;
    bool writes_inf_on_purpose = false;  // A fill or full with an infinite value.
    uint8_t out_flags = 0;
    format::DType dtype = -1;
    std::vector<uint64_t> inputs;   // Keys of its inputs.
    std::vector<uint64_t> outputs;  // Keys of its non-finite outputs.
  };
  // A backward node's execution. Autograd's engine records no outputs for it: the gradients it
  // made are the inputs of the nodes its edges lead to, executed after it.
  struct Exec {
    format::ObjectId op = 0;
    format::ObjectId node = 0;
    format::InternId name = 0;
    uint64_t order = 0;
    uint64_t step = 0;
    uint64_t marked_step = 0;
    format::DType dtype = -1;
    std::vector<uint64_t> inputs;
  };
  // Where a non-finite value came from: an op (index in ops_), a backward node's execution
  // (index in execs_) or an input that brought it in (its key).
  struct Root {
    enum Kind : uint8_t { kNone, kOp, kExec, kData } kind = kNone;
    uint32_t index = 0;
    uint64_t data = 0;
    uint64_t order = 0;
    uint32_t became_nan = UINT32_MAX;  // ops_ index where its Inf turned NaN.
    bool on_purpose = false;           // An Inf written on purpose (a mask).
    bool valid() const { return kind != kNone; }
    bool same(const Root& o) const { return kind == o.kind && index == o.index && data == o.data; }
  };

  static uint64_t Key(format::ObjectId tensor, uint32_t version) {
    return (tensor << 20) ^ (tensor >> 44) ^ version ^ 0x8000000000000000ull;
  }
  uint8_t FlagsOf(uint64_t key) const;
  bool InsideCollective(const Op& op) const;
  Root DataRoot(uint64_t key, bool on_purpose) const;
  static Root Earlier(const Root& a, const Root& b);
  Root Follow(const Op& op, uint32_t index, bool nan, const std::vector<Root>& nan_roots,
              const std::vector<Root>& inf_roots) const;
  void ExecRoots(std::vector<Root>& roots) const;
  void Resolve(const Root& root, bool nan, const char* reached, uint64_t later, uint64_t steps);

  AnalysisState& state_;
  std::unordered_map<uint64_t, Value> values_;
  std::vector<Op> ops_;
  std::vector<Exec> execs_;
  std::unordered_map<format::ObjectId, uint32_t> op_index_;    // Op id -> index in ops_.
  std::unordered_map<format::ObjectId, uint32_t> exec_index_;  // Op id -> index in execs_.
  // Values the program read to the host or started backward from (item(), the seed's ones_like).
  std::unordered_set<uint64_t> read_keys_;
  // GradScaler checks: their step (by rule, marked) and inputs.
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>>> scaler_checks_;
  // Steps in which a WhereBackward0 node ran (the where trap's sign), by rule and marked.
  std::unordered_set<uint64_t> where_steps_;
  std::unordered_set<uint64_t> where_marked_steps_;
  uint64_t order_ = 0;
  std::vector<uint64_t> input_keys_;  // OnOp's scratch: the op's input keys, in order.
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_NON_FINITE_H_
