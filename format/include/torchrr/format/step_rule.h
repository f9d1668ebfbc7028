// StepRule: where a training step begins in a trace whose program marks no steps.
//
// A recorder that keeps the last steps, a reader that numbers steps and the codec that codes a
// step against the one before it must agree on where steps begin, so the rule (format/SPEC.md,
// "Steps") lives here, once. A step is a backward pass, the forward ops before it and what runs
// after it up to the next forward: after a backward function ran, the first top-level op (parent
// 0) that ends having created autograd nodes (NodeRecords since the previous top-level op) begins
// the next step, which holds the records written after the previous top-level op. Top-level ops
// that create no node (no_grad, item(), a frozen embedding's lookup) stay in the step they follow.
//
// Fed records in trace order; a program's own marks (StepRecord) are for the caller to honour.
// Not thread-safe; cheap to copy.
#ifndef TORCHRR_FORMAT_STEP_RULE_H_
#define TORCHRR_FORMAT_STEP_RULE_H_

#include <cstdint>
#include <variant>

#include "torchrr/format/records.h"

namespace torchrr::format {

class StepRule {
 public:
  // A NodeRecord of a node the op being recorded created. A caller that sees a node more than
  // once (a definition repeated) counts it once.
  void OnNode() { ++nodes_since_top_level_; }

  // An op ended. Returns true when it begins a new step (a top-level op, so the step boundary is
  // right after the previous top-level op and its records). A backward function run at top level
  // is a top-level op: nodes created before it do not count for the ops after it.
  // `engine_wrapper`: the op is autograd's engine's wrapper around a node it runs
  // (`autograd::engine::evaluate_function: X`), part of the backward pass: never a step's first
  // op, and it leaves the count of nodes as it is.
  bool OnOp(const OpRecord& op, bool engine_wrapper = false) {
    if (engine_wrapper) return false;
    bool begins = false;
    if (op.scope == OpScope::kBackwardFunction) {
      backward_ran_ = true;
    } else if (op.parent == 0 && backward_ran_ && nodes_since_top_level_ != 0) {
      begins = true;
      backward_ran_ = false;
    }
    if (op.parent == 0) nodes_since_top_level_ = 0;
    return begins;
  }

  // OnNode or OnOp for the records that are either; false for the others.
  bool Add(const Record& record) {
    if (std::holds_alternative<NodeRecord>(record)) OnNode();
    const auto* op = std::get_if<OpRecord>(&record);
    return op != nullptr && OnOp(*op);
  }

 private:
  uint64_t nodes_since_top_level_ = 0;
  bool backward_ran_ = false;
};

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_STEP_RULE_H_
