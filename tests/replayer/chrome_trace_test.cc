// export --chrome-trace's events (torchrr/replayer/chrome_trace.h) on hand-built records: the kernels'
// tracks and flows, and what a damaged trace (an op that was not read) leaves out.
#include "torchrr/replayer/chrome_trace.h"

#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using testing::TraceBuilder;

// The events of `records` exported, as the export verb's two passes make them.
nlohmann::json Export(const std::vector<format::Record>& records) {
  ChromeTracePlan plan;
  for (const format::Record& r : records) plan.See(r);
  replayer::Report report = replayer::Analyze(records);
  std::ostringstream out;
  ChromeTraceWriter writer(out, plan, report, format::FileInfo{.pid = 7});
  for (const format::Record& r : records) writer.Add(r);
  writer.Finish();
  return nlohmann::json::parse(out.str())["traceEvents"];
}

std::vector<nlohmann::json> Phase(const nlohmann::json& events, const std::string& phase) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : events) {
    if (e["ph"] == phase) out.push_back(e);
  }
  return out;
}

format::CudaKernelRecord Kernel(TraceBuilder& b, format::ObjectId op, uint32_t stream) {
  format::CudaKernelRecord k;
  k.name = b.Str("gemm");
  k.op = op;
  k.stream = stream;
  k.start_ns = b.Now();
  k.end_ns = b.Now();
  return k;
}

TEST(ChromeTrace, KernelsOnTheirStreamWithAFlowFromTheirOp) {
  TraceBuilder b;
  format::ObjectId x = b.Leaf({4});
  format::ObjectId op = b.Op({.name = "aten::mm", .inputs = {x}, .stack = b.At(3)});
  b.records.push_back(Kernel(b, op, 7));
  b.records.push_back(Kernel(b, op, 9));
  nlohmann::json events = Export(b.records);
  auto starts = Phase(events, "s");
  auto ends = Phase(events, "f");
  ASSERT_EQ(starts.size(), 2u);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_NE(ends[0]["tid"], ends[1]["tid"]) << "two streams, two tracks";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(starts[i]["id"], ends[i]["id"]);
    EXPECT_EQ(starts[i]["tid"], 1) << "the flow starts on the op's thread";
  }
  for (const nlohmann::json& e : Phase(events, "X")) {
    if (e["name"] == "aten::mm") EXPECT_EQ(e["args"]["location"], "train.py:3 in forward");
  }
}

TEST(ChromeTrace, AKernelWhoseOpWasNotReadHasNoFlow) {
  TraceBuilder b;
  b.records.push_back(Kernel(b, /*op=*/424242, 7));
  nlohmann::json events = Export(b.records);
  EXPECT_EQ(Phase(events, "X").size(), 1u) << "the kernel's slice is still there";
  EXPECT_TRUE(Phase(events, "s").empty());
  EXPECT_TRUE(Phase(events, "f").empty()) << "a flow end without its start";
}

}  // namespace
}  // namespace torchrr::replayer
