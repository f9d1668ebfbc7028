// StepTimeline: the recorded run drawn as one row per thread, what ran when coloured by phase
// (forward and other ops, backward, optimizer), with the save, the write and the use of each
// violation marked, as an SVG element `torchrr report` inlines.
//
// A phase is decided by the outermost ops of each thread: a backward function or node execution
// is backward, a user scope PyTorch's optimizers open ("Optimizer.step#SGD.step",
// "Optimizer.zero_grad#...") is the optimizer, anything else forward. Spans closer than a pixel
// are merged, so the drawing's size is bounded by its width, not by the ops; long stretches with
// no op on any thread (importing torch, building the model) are cut to a narrow dashed box, so
// that the step fills the width. Memory: the outermost
// ops' times (three numbers each) and the marked ops'. Not thread-safe.
#ifndef TORCHRR_REPLAYER_STEP_TIMELINE_H_
#define TORCHRR_REPLAYER_STEP_TIMELINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"
#include "torchrr/replayer/trace_tables.h"

namespace torchrr::replayer {

class StepTimeline {
 public:
  enum class Phase : uint8_t { kForward, kBackward, kOptimizer };

  // `report`'s violations say which ops to mark; it must outlive the timeline.
  explicit StepTimeline(const replayer::Report& report);

  void See(const format::Record& record, const TraceTables& names);

  // The <svg> element, 960 pixels wide; "" when the trace has no timed op.
  std::string Svg() const;

 private:
  struct Span {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    Phase phase = Phase::kForward;
  };
  struct OpTime {
    uint32_t thread = 0;
    int64_t start_ns = 0;
  };
  struct Geometry;
  Geometry Layout() const;
  void Add(uint32_t thread, int64_t start_ns, int64_t end_ns, Phase phase);
  // The parts of Svg(), each appended to `svg`.
  void EmitLegend(std::string& svg) const;
  void EmitRow(const Geometry& g, uint32_t thread, const std::vector<Span>& spans,
               std::string& svg) const;
  void EmitMarks(const Geometry& g, size_t index, std::string& svg) const;
  void EmitAxis(const Geometry& g, std::string& svg) const;

  const replayer::Report& report_;
  std::unordered_set<format::ObjectId> marked_;  // Victims, culprits, uses.
  std::unordered_map<format::ObjectId, OpTime> marked_times_;
  std::map<uint32_t, std::vector<Span>> threads_;
  int64_t first_ns_ = INT64_MAX;
  int64_t last_ns_ = INT64_MIN;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_STEP_TIMELINE_H_
