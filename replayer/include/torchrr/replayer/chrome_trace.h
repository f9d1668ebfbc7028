// A torchrr trace as a Chrome Trace Event file (the JSON object form, {"traceEvents": [...]}),
// which Perfetto's UI (ui.perfetto.dev) and chrome://tracing open. Format:
// https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
//
// What becomes what:
//   - every op: a complete slice ("X") on its thread, its tensors (id, dtype, shape, versions
//     before and after), its other arguments (as Python writes them) and its user frame as args;
//   - every backward node execution: a slice named after the node on the thread that ran it (it
//     replaces the op record of the same execution, which carries the same time and thread);
//   - every CUDA kernel, copy and memset: a slice on a track of its own per device and stream, with
//     a flow ("s" in the launching op, "f" at the kernel) when the launching op is known;
//   - every violation of the replayer's report: an instant ("i") where the saved tensor was used
//     (or would have been), with the culprit, its line, the victim and the node as args;
//   - process and thread names as metadata ("M").
// Timestamps are microseconds from the trace's first timestamp (the format's unit), never negative.
//
// The trace is read twice: the first pass (ChromeTracePlan) finds the first timestamp, which ops
// launched kernels and which op records are node executions, and feeds the analysis; the second
// (ChromeTraceWriter) writes the events as the records come, but for the flows' ends, which wait
// for the end to be written only where their start was; memory stays bounded by the trace's
// names, tensors and CUDA activities, not its ops.
#ifndef TORCHRR_REPLAYER_CHROME_TRACE_H_
#define TORCHRR_REPLAYER_CHROME_TRACE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// The first pass. Not thread-safe.
class ChromeTracePlan {
 public:
  void See(const format::Record& record);

  // The earliest timestamp of the trace; 0 when it has none.
  int64_t first_ns() const { return first_ns_ == kNoTime ? 0 : first_ns_; }
  bool IsNodeExecution(format::ObjectId op) const { return node_exec_ops_.contains(op); }
  // The flow ids of the kernels, copies and memsets `op` launched, in trace order.
  const std::vector<uint64_t>* Launches(format::ObjectId op) const;

 private:
  static constexpr int64_t kNoTime = std::numeric_limits<int64_t>::max();
  void SeeTime(int64_t ns);

  int64_t first_ns_ = kNoTime;
  std::unordered_set<format::ObjectId> node_exec_ops_;
  std::unordered_map<format::ObjectId, std::vector<uint64_t>> launches_;
  uint64_t device_activities_ = 0;  // Kernels, copies and memsets seen: the next flow id - 1.
};

// How every document ChromeTraceWriter writes begins: `torchrr export -o` replaces an existing
// file only when it starts so (or with --force).
inline constexpr std::string_view kChromeTracePrefix =
    "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"torchrr\",";

// The second pass: writes the events to `out` as the records come. Call Add() for every record
// in file order, then Finish() once, which closes the JSON document. Not thread-safe.
class ChromeTraceWriter {
 public:
  // `plan` and `report` (the analysis of the same records) must outlive the writer.
  ChromeTraceWriter(std::ostream& out, const ChromeTracePlan& plan, const replayer::Report& report,
                    const format::FileInfo& info);
  ~ChromeTraceWriter();
  ChromeTraceWriter(const ChromeTraceWriter&) = delete;
  ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

  void Add(const format::Record& record);
  void Finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_CHROME_TRACE_H_
