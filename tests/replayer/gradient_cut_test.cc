// Where the gradient stopped (GradientCutWatch): the op on the loss's path that cut it when
// backward raised "does not require grad", the parameters a reentrant checkpoint kept from a
// backward that ran, and the twins that must stay silent (a teacher under no_grad, adapters that
// were reached); on record sequences shaped like the recorder's (trace_builder.h).
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exit_codes.h"
#include "gradient_cut.h"
#include "torchrr/replayer/editor_formats.h"
#include "torchrr/replayer/replayer.h"
#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using format::ObjectId;
using testing::Forwarded;
using testing::TraceBuilder;

constexpr char kNoGradFn[] =
    "element 0 of tensors does not require grad and does not have a grad_fn";

uint32_t LineOf(const std::optional<OpRef>& op) {
  return op && op->user_frame ? op->user_frame->line : 0;
}

// with torch.no_grad(): out = model(x)   (line 10)
// loss = out.mean()                        (line 11)
// loss.backward()                          raises
TEST(GradientCut, NoGradForwardIsTheCut) {
  TraceBuilder b;
  ObjectId w = b.Leaf({8, 8});
  ObjectId x = b.Tensor({4, 8});
  ObjectId out = b.Tensor({4, 8});
  b.Op({.name = "aten::linear", .inputs = {x, w}, .outputs = {out}, .stack = b.At(10),
        .grad_mode = false});
  ObjectId loss = b.Tensor({});
  b.Op({.name = "aten::mean", .inputs = {out}, .outputs = {loss}, .stack = b.At(11)});
  b.PythonError(kNoGradFn);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  const GradientCut& cut = report.gradient_cuts[0];
  EXPECT_EQ(cut.cause, CutCause::kNoGrad);
  EXPECT_TRUE(cut.raised);
  EXPECT_EQ(LineOf(cut.op), 10u);
  EXPECT_EQ(LineOf(cut.loss), 11u);
  EXPECT_EQ(cut.parameter_count, 1u);
  ASSERT_EQ(cut.parameters.size(), 1u);
  EXPECT_EQ(cut.parameters[0].name, "weight");  // aten::linear's argument 1, no module.
  EXPECT_EQ(cut.pytorch_message, kNoGradFn);
  // The cut explains PyTorch's error: it is not reported as one torchrr does not explain.
  EXPECT_FALSE(report.program_error);
  EXPECT_TRUE(report.violations.empty());

  nlohmann::json j = ToJson(report);
  EXPECT_EQ(j["gradient_cuts"][0]["cause"], "no_grad");
  EXPECT_EQ(j["gradient_cuts"][0]["op"]["user_frame"]["line"], 10);
  EXPECT_TRUE(j["program_error"].is_null());

  const std::string text = FormatText(report, false);
  EXPECT_NE(text.find("backward raised: the path from trainable parameters to the loss was cut"),
            std::string::npos) << text;
  EXPECT_NE(text.find("train.py:10"), std::string::npos) << text;
  EXPECT_NE(text.find("the gradient stopped at 1 place"), std::string::npos) << text;
  EXPECT_NE(FormatShortVerdict(report, "run.trr").find("the gradient stopped"), std::string::npos);

  ReplayedTrace trace;
  trace.path = "run.trr";
  trace.report = report;
  const std::string gnu = FormatGnu({trace});
  EXPECT_NE(gnu.find("train.py:10:1: error: the gradient stopped"), std::string::npos) << gnu;
  EXPECT_NE(ToSarif({trace}, "0").dump().find("\"gradient_cut\""), std::string::npos);
}

// torch.inference_mode(): the output is an inference tensor (no version counter).
TEST(GradientCut, InferenceModeIsNamed) {
  TraceBuilder b;
  ObjectId w = b.Leaf({8, 8});
  ObjectId x = b.Tensor({4, 8});
  ObjectId out = b.Tensor({4, 8});
  format::TensorInfo& info = b.Info(out);
  info.version_counter = 0;
  b.records.push_back(info);
  b.Op({.name = "aten::linear", .inputs = {x, w}, .outputs = {out}, .stack = b.At(10),
        .grad_mode = false});
  ObjectId loss = b.Tensor({});
  b.Op({.name = "aten::mean", .inputs = {out}, .outputs = {loss}, .stack = b.At(11)});
  b.PythonError(kNoGradFn);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  EXPECT_EQ(report.gradient_cuts[0].cause, CutCause::kInferenceMode);
}

// loss = (model(x).detach() - y).pow(2).mean()   (line 6)
TEST(GradientCut, DetachInTheLoss) {
  TraceBuilder b;
  ObjectId w = b.Leaf({8, 1});
  ObjectId x = b.Tensor({4, 8});
  Forwarded pred = b.Forward("aten::mm", "MmBackward0", {x, w}, {}, b.At(5), {4, 1});
  ObjectId detached = b.Tensor({4, 1});
  b.Op({.name = "aten::detach", .inputs = {pred.out}, .outputs = {detached}, .stack = b.At(6)});
  ObjectId loss = b.Tensor({});
  b.Op({.name = "aten::mean", .inputs = {detached}, .outputs = {loss}, .stack = b.At(6)});
  b.PythonError(kNoGradFn);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  EXPECT_EQ(report.gradient_cuts[0].cause, CutCause::kDetach);
  EXPECT_EQ(LineOf(report.gradient_cuts[0].op), 6u);
}

// total = model(x).sum().item()   (line 7); loss = torch.tensor(total) * 2   (line 8)
TEST(GradientCut, ItemMadeATensorAgain) {
  TraceBuilder b;
  ObjectId w = b.Leaf({8, 1});
  ObjectId x = b.Tensor({4, 8});
  Forwarded pred = b.Forward("aten::mm", "MmBackward0", {x, w}, {}, b.At(7), {4, 1});
  b.Op({.name = "aten::item", .inputs = {pred.out}, .stack = b.At(7)});
  ObjectId fresh = b.Tensor({});
  ObjectId loss = b.Tensor({});
  b.Op({.name = "aten::mul", .inputs = {fresh}, .outputs = {loss}, .stack = b.At(8)});
  b.PythonError(kNoGradFn);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  EXPECT_EQ(report.gradient_cuts[0].cause, CutCause::kItem);
  EXPECT_EQ(LineOf(report.gradient_cuts[0].op), 7u);
  EXPECT_EQ(LineOf(report.gradient_cuts[0].loss), 8u);
}

// Every parameter frozen: nothing connects the loss to a tensor that requires grad.
TEST(GradientCut, NoParameterAtAll) {
  TraceBuilder b;
  ObjectId w = b.Tensor({8, 1});
  ObjectId x = b.Tensor({4, 8});
  ObjectId out = b.Tensor({4, 1});
  b.Op({.name = "aten::mm", .inputs = {x, w}, .outputs = {out}, .stack = b.At(5)});
  ObjectId loss = b.Tensor({});
  b.Op({.name = "aten::mean", .inputs = {out}, .outputs = {loss}, .stack = b.At(6)});
  b.PythonError(kNoGradFn);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  EXPECT_EQ(report.gradient_cuts[0].cause, CutCause::kNoParameter);
  EXPECT_FALSE(report.gradient_cuts[0].op);
  EXPECT_EQ(LineOf(report.gradient_cuts[0].loss), 6u);
}

// Adapters inside checkpoint(use_reentrant=True) whose input does not require grad, then a
// trainable head: backward runs, reaches the head, never the adapter.
struct CheckpointProgram {
  TraceBuilder b;
  ObjectId adapter = 0, head = 0;
  Forwarded head_out, loss;

  explicit CheckpointProgram(bool adapter_reached) {
    adapter = b.Leaf({8, 8});
    head = b.Leaf({8, 1});
    ObjectId h = b.Tensor({4, 8});
    ObjectId checkpoint = b.NewId();
    ObjectId inner = b.Tensor({4, 8});
    // Recorded at their end: the op under the checkpoint first, then the checkpoint's own.
    b.Op({.name = "aten::linear", .inputs = {h, adapter}, .outputs = {inner},
          .parent = checkpoint, .stack = b.At(20, "peft.py"), .grad_mode = false});
    b.Op({.name = "CheckpointFunction", .inputs = {h}, .outputs = {inner}, .id = checkpoint,
          .stack = b.At(30)});
    head_out = b.Forward("aten::mm", "MmBackward0", {inner, head}, {}, b.At(31), {4, 1});
    loss = b.Forward("aten::mean", "MeanBackward0", {head_out.out}, {}, b.At(32), {1});
    std::vector<ObjectId> run{loss.node, head_out.node, b.AccumulateGradOf(head)};
    // The recomputation's backward reached it (what a checkpoint with an input that requires
    // grad does).
    if (adapter_reached) run.push_back(b.AccumulateGradOf(adapter));
    b.Backward(run);
  }
};

TEST(GradientCut, ReentrantCheckpointKeepsAdaptersFromBackward) {
  CheckpointProgram p(false);
  Report report = Analyze(p.b.records);
  ASSERT_EQ(report.gradient_cuts.size(), 1u);
  const GradientCut& cut = report.gradient_cuts[0];
  EXPECT_EQ(cut.cause, CutCause::kReentrantCheckpoint);
  EXPECT_FALSE(cut.raised);
  EXPECT_EQ(LineOf(cut.checkpoint), 30u);
  EXPECT_EQ(LineOf(cut.op), 20u);
  EXPECT_EQ(cut.parameter_count, 1u);
  ASSERT_EQ(cut.parameters.size(), 1u);
  EXPECT_EQ(cut.parameters[0].id, p.adapter);
  EXPECT_EQ(cut.backward_passes, 1u);
  EXPECT_NE(cut.help.find("enable_input_require_grads()"), std::string::npos);
  EXPECT_NE(cut.help.find("use_reentrant=False"), std::string::npos);
  EXPECT_EQ(cli::ReplayExitCode(0, false, false, false, true), cli::kExitGradientCut);
}

TEST(GradientCut, ReachedAdaptersAreSilent) {
  CheckpointProgram p(true);
  Report report = Analyze(p.b.records);
  EXPECT_TRUE(report.gradient_cuts.empty());
  EXPECT_EQ(cli::ReplayExitCode(0, false, false, false, false), cli::kExitOk);
}

// A teacher under the user's no_grad: its parameters require grad and get none, by design.
TEST(GradientCut, TeacherUnderNoGradIsSilent) {
  TraceBuilder b;
  ObjectId teacher = b.Leaf({8, 1});
  ObjectId student = b.Leaf({8, 1});
  ObjectId frozen = b.Tensor({8, 8});
  ObjectId x = b.Tensor({4, 8});
  ObjectId target = b.Tensor({4, 1});
  b.Op({.name = "aten::mm", .inputs = {x, teacher}, .outputs = {target}, .stack = b.At(5),
        .grad_mode = false});
  ObjectId features = b.Tensor({4, 8});
  b.Op({.name = "aten::mm", .inputs = {x, frozen}, .outputs = {features}, .stack = b.At(6)});
  Forwarded out = b.Forward("aten::mm", "MmBackward0", {features, student}, {}, b.At(7), {4, 1});
  Forwarded loss = b.Forward("aten::mse_loss", "MseLossBackward0", {out.out, target}, {},
                             b.At(8), {1});
  b.Backward({loss.node, out.node, b.AccumulateGradOf(student)});
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.gradient_cuts.empty());
  EXPECT_EQ(FormatShortVerdict(report, "run.trr"), "");
}

TEST(GradientCut, ParametersInFewWords) {
  std::vector<CutParameter> parameters;
  for (int layer = 0; layer < 12; ++layer) {
    for (const char* proj : {"q_proj", "v_proj"}) {
      for (const char* lora : {"lora_A", "lora_B"}) {
        parameters.push_back({0,
                              "base_model.model.model.layers." + std::to_string(layer) +
                                  ".self_attn." + proj + "." + lora + ".default.weight",
                              "", {}});
      }
    }
  }
  EXPECT_EQ(CutParameterSummary(parameters, 48), "48 lora_A/lora_B in layers 0-11");
  EXPECT_EQ(CutParameterSummary({{0, "fc.weight", "", {}}, {0, "fc.bias", "", {}}}, 2), "2 fc");
  EXPECT_EQ(CutParameterSummary({}, 0), "");
}

}  // namespace
}  // namespace torchrr::replayer
