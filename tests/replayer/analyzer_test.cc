// The replayer's analysis on record sequences shaped like the recorder's (trace_builder.h).
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "torchrr/replayer/replayer.h"
#include "trace_builder.h"

#ifdef TORCHRR_HAVE_FORMAT
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#endif

namespace torchrr::replayer {
namespace {

using testing::Forwarded;
using testing::kOutput;
using testing::Line;
using testing::TraceBuilder;

constexpr char kSigmoidMessage[] =
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: [torch.FloatTensor [4, 8]], which is output 0 of SigmoidBackward0, is at version "
    "1; expected version 0 instead. Hint: enable anomaly detection.";

// y = x.sigmoid(); y.mul_(2); y.sum().backward()
struct SigmoidMulProgram {
  TraceBuilder b;
  Forwarded y, mul, loss;

  explicit SigmoidMulProgram(bool with_message = true) {
    auto x = b.Leaf({4, 8});
    y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
    mul = b.InplaceForward("aten::mul_", "MulBackward1", y.out, {}, b.At(12));
    loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
    b.Backward({loss.node, mul.node, y.node}, y.node, with_message ? kSigmoidMessage : "");
  }
};

TEST(AnalyzerTest, SigmoidThenMulInPlaceOnItsOutput) {
  SigmoidMulProgram p;
  Report report = Analyze(p.b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kVersion);
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->name, "aten::mul_");
  EXPECT_EQ(v.culprit->id, p.mul.op);
  EXPECT_EQ(Line(v.culprit), 12u);
  EXPECT_EQ(v.culprit->user_frame->file, "train.py");
  EXPECT_EQ(v.culprit->user_frame->function, "forward");
  EXPECT_EQ(v.culprit->stack.size(), 2u);
  EXPECT_TRUE(v.later_culprits.empty());
  ASSERT_TRUE(v.victim);
  EXPECT_EQ(v.victim->name, "aten::sigmoid");
  EXPECT_EQ(Line(v.victim), 11u);
  EXPECT_EQ(v.backward_node.name, "SigmoidBackward0");
  EXPECT_EQ(v.backward_node.id, p.y.node);
  EXPECT_EQ(v.saved_version, 0u);
  EXPECT_EQ(v.current_version, 1u);
  EXPECT_EQ(v.tensor.id, p.y.out);
  EXPECT_EQ(v.tensor.saved_name, "result");
  EXPECT_EQ(v.tensor.shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(v.tensor.dtype, "float32");
  EXPECT_EQ(v.tensor.device, "cpu");
  EXPECT_TRUE(v.pytorch_raised);
  EXPECT_EQ(v.pytorch_message, kSigmoidMessage);
  EXPECT_EQ(v.pytorch_names, "output 0 of SigmoidBackward0");
  EXPECT_FALSE(v.simulated);
  EXPECT_EQ(report.backward_passes, 1u);
  EXPECT_EQ(report.node_executions, 3u);
  EXPECT_EQ(report.version_bumps, 1u);
}

// The same bug at every step is one diagnostic: the trace marks no steps, so the analysis counts
// them as the recorder does (a forward op that makes nodes after backward ran begins a step).
TEST(AnalyzerTest, TheSameBugAtEveryStepIsOneDiagnosticWithItsSteps) {
  TraceBuilder b;
  for (int step = 0; step < 3; ++step) {
    auto x = b.Leaf({4, 8});
    auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
    auto mul = b.InplaceForward("aten::mul_", "MulBackward1", y.out, {}, b.At(12));
    auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
    b.Backward({loss.node, mul.node, y.node});
  }
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(report.violations[i].step, i);
  ASSERT_EQ(report.groups.size(), 1u);
  EXPECT_EQ(report.groups[0].violations, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(report.groups[0].steps, (std::vector<uint64_t>{0, 1, 2}));
  const std::string grouped = FormatText(report, false);
  EXPECT_NE(grouped.find("= 3 times: steps 0-2; first at step 0"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("3 violations at 1 place"), std::string::npos) << grouped;
  auto errors = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("error:"); at != std::string::npos; at = text.find("error:", at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(errors(grouped), 1u);
  EXPECT_EQ(errors(FormatText(report, false, /*each=*/true)), 3u);
  const nlohmann::json json = ToJson(report);
  EXPECT_EQ(json["groups"][0]["count"], 3);
  EXPECT_EQ(json["violations"][2]["step"], 2);
}

TEST(AnalyzerTest, NumberRangesJoinRuns) {
  EXPECT_EQ(NumberRanges({}), "");
  EXPECT_EQ(NumberRanges({4}), "4");
  EXPECT_EQ(NumberRanges({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(NumberRanges({3, 5, 7, 8, 9}), "3, 5, 7-9");
}

// torch.compile: the ops run from frames of torch (an FX Interpreter running a graph node) and
// of generated code, whose origins (FrameDef.origin) are the user's lines; the report shows those.
TEST(AnalyzerTest, FramesInGeneratedCodeShowTheirOrigin) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto traced = [&](uint32_t line) {
    return b.Stack({{"torch/fx/interpreter.py", 294, "Interpreter.run_node", true, "model.py",
                     line, "mlp_forward"},
                    {"torch/_dynamo/eval_frame.py", 10, "_fn", true}});
  };
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, traced(66));
  auto mul = b.InplaceForward(
      "aten::mul_", "MulBackward1", y.out, {},
      b.Stack({{"<eval_with_key>.3", 12, "forward", false, "model.py", 68, "mlp_forward"}}));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, mul.node, y.node}, y.node, kSigmoidMessage);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  ASSERT_TRUE(v.culprit && v.culprit->user_frame && v.victim && v.victim->user_frame);
  EXPECT_EQ(v.culprit->user_frame->file, "model.py");
  EXPECT_EQ(v.culprit->user_frame->line, 68u);
  EXPECT_EQ(v.culprit->user_frame->function, "mlp_forward");
  ASSERT_EQ(v.culprit->stack.size(), 1u);
  EXPECT_EQ(v.culprit->stack[0].generated_file, "<eval_with_key>.3");
  EXPECT_EQ(v.culprit->stack[0].generated_line, 12u);
  EXPECT_EQ(v.victim->user_frame->file, "model.py");
  EXPECT_EQ(v.victim->user_frame->line, 66u);
  ASSERT_EQ(v.victim->stack.size(), 2u);
  EXPECT_FALSE(v.victim->stack[0].framework);
  EXPECT_EQ(v.victim->stack[0].generated_function, "Interpreter.run_node");
  EXPECT_TRUE(v.victim->stack[1].generated_file.empty());
}

// A compiled region saves its input; the program writes it before backward. The region's call is
// the op that saved it; the line inside the region that backward uses it for (format 1.7's
// SavedTensor.used_at) names the victim, its frames before the region's call.
TEST(AnalyzerTest, CompiledRegionVictimIsTheLineThatUsesTheSavedTensor) {
  for (bool with_use : {true, false}) {
    TraceBuilder b;
    auto x = b.Leaf({4});
    auto h = b.Forward("aten::mul", "MulBackward0", {x}, {}, b.At(10), {});
    auto region = b.Forward("CompiledFunction", "CompiledFunctionBackward", {h.out},
                            {{"saved_tensors", h.out}}, b.At(20, "train.py", "train"));
    b.Inplace("aten::add_", h.out, {}, b.At(21, "train.py", "train"));
    auto loss = b.Forward("aten::sum", "SumBackward0", {region.out}, {}, b.At(22), {});
    const format::InternId use = b.Stack({{"model.py", 72, "mlp_forward", false},
                                  {"model.py", 94, "decoder_layer_forward", false}});
    b.Backward({loss.node, region.node}, region.node, kSigmoidMessage);
    for (format::Record& r : b.records) {
      if (auto* node = std::get_if<format::NodeRecord>(&r); node && node->node == region.node) {
        if (with_use) node->saved[0].used_at = use;
      }
    }
    Report report = Analyze(b.records);
    ASSERT_EQ(report.violations.size(), 1u);
    const Violation& v = report.violations[0];
    ASSERT_TRUE(v.victim && v.victim->user_frame);
    EXPECT_EQ(v.victim->name, "CompiledFunction");
    if (!with_use) {
      EXPECT_EQ(v.victim->user_frame->line, 20u);
      continue;
    }
    EXPECT_EQ(v.victim->user_frame->file, "model.py");
    EXPECT_EQ(v.victim->user_frame->line, 72u);
    EXPECT_EQ(v.victim->user_frame->function, "mlp_forward");
    ASSERT_EQ(v.victim->stack.size(), 4u);
    EXPECT_EQ(v.victim->stack[1].line, 94u);
    EXPECT_EQ(v.victim->stack[3].line, 20u);  // The region's call, after torch's frame.
  }
}

TEST(AnalyzerTest, RaisedWithoutCppMessageTakesThePythonOne) {
  SigmoidMulProgram p(/*with_message=*/false);
  p.b.PythonError(std::string("RuntimeError: ") + kSigmoidMessage);
  Report report = Analyze(p.b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  EXPECT_TRUE(report.violations[0].pytorch_raised);
  ASSERT_TRUE(report.violations[0].pytorch_message);
  EXPECT_NE(report.violations[0].pytorch_message->find("is at version 1"), std::string::npos);
}

// a = x.exp(); z = a * w; a += y; z.sum().backward(): MulBackward0 needs `self` (a), which
// PyTorch names by its new grad_fn, AddBackward0.
TEST(AnalyzerTest, AddInPlaceOnSavedInputOfMulNamesTheInPlaceNode) {
  TraceBuilder b;
  auto x = b.Leaf({3});
  auto w = b.Leaf({3});
  auto y = b.Tensor({3});
  auto a = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(20));
  auto z = b.Forward("aten::mul", "MulBackward0", {a.out, w}, {{"self", a.out}, {"other", w}},
                     b.At(21));
  auto add = b.InplaceForward("aten::add_", "AddBackward0", a.out, {y}, b.At(22));
  auto loss = b.Forward("aten::sum", "SumBackward0", {z.out}, {}, b.At(23), {});
  b.Backward({loss.node, z.node}, z.node,
             "one of the variables needed for gradient computation has been modified by an "
             "inplace operation: [torch.FloatTensor [3]], which is output 0 of AddBackward0, is at "
             "version 1; expected version 0 instead.");
  Report report = Analyze(b.records);
  // MulBackward0 raised; ExpBackward0 (the rest of the pass) also saved `a` and is reported too.
  ASSERT_EQ(report.violations.size(), 2u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.backward_node.name, "MulBackward0");
  EXPECT_EQ(v.tensor.saved_name, "self");
  EXPECT_EQ(v.culprit->name, "aten::add_");
  EXPECT_EQ(v.culprit->id, add.op);
  EXPECT_EQ(Line(v.culprit), 22u);
  EXPECT_EQ(Line(v.victim), 21u);
  EXPECT_EQ(v.pytorch_names, "output 0 of AddBackward0");
  EXPECT_TRUE(v.pytorch_raised);
  const Violation& rest = report.violations[1];
  EXPECT_EQ(rest.backward_node.name, "ExpBackward0");
  EXPECT_TRUE(rest.simulated);
  EXPECT_FALSE(rest.pytorch_raised);
  EXPECT_EQ(rest.pytorch_names, "output 0 of ExpBackward0");
  EXPECT_EQ(Line(rest.culprit), 22u);
}

// z = x @ w; w.sub_(0.1) under no_grad (an optimizer step) before z.sum().backward().
TEST(AnalyzerTest, LeafModifiedByOptimizerStepBetweenForwardAndBackward) {
  TraceBuilder b;
  auto x = b.Tensor({2, 4});
  auto w = b.Leaf({4, 3});
  auto z = b.Forward("aten::mm", "MmBackward0", {x, w}, {{"self", x}, {"mat2", w}}, b.At(30),
                     {2, 3});
  auto step = b.Inplace("aten::sub_", w, {}, b.At(31, "optim.py", "step"), /*grad_mode=*/false);
  auto loss = b.Forward("aten::sum", "SumBackward0", {z.out}, {}, b.At(32), {});
  b.Backward({loss.node, z.node}, z.node,
             "one of the variables needed for gradient computation has been modified by an "
             "inplace operation: [torch.FloatTensor [4, 3]] is at version 1; expected version 0 "
             "instead.");
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.culprit->id, step);
  EXPECT_EQ(v.culprit->user_frame->file, "optim.py");
  EXPECT_EQ(Line(v.culprit), 31u);
  EXPECT_EQ(v.backward_node.name, "MmBackward0");
  EXPECT_EQ(v.tensor.saved_name, "mat2");
  EXPECT_EQ(v.tensor.id, w);
  EXPECT_FALSE(v.pytorch_names);  // A leaf: PyTorch names no node.
  EXPECT_TRUE(v.pytorch_raised);
}

TEST(AnalyzerTest, TwoModificationsGiveFirstCulpritAndLaterOnes) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto first = b.Inplace("aten::mul_", y.out, {}, b.At(12), false);
  auto second = b.Inplace("aten::add_", y.out, {}, b.At(13), false);
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(14), {});
  b.Backward({loss.node, y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.culprit->id, first);
  EXPECT_EQ(Line(v.culprit), 12u);
  ASSERT_EQ(v.later_culprits.size(), 1u);
  EXPECT_EQ(v.later_culprits[0].id, second);
  EXPECT_EQ(v.later_culprits[0].user_frame->line, 13u);
  EXPECT_EQ(v.saved_version, 0u);
  EXPECT_EQ(v.current_version, 2u);
  // The first write alone did not take the version from 0 to 2.
  const std::string text = FormatText(report, /*color=*/false);
  EXPECT_NE(text.find("aten::mul_ and 1 later write changed the version 0 -> 2"),
            std::string::npos) << text;
}

// A model's forward under Trainer.train(): the user frame is the train() line, and the report
// also names the library line that ran the op; a write the user's line made itself gets none.
TEST(AnalyzerTest, LibraryFrameThatRanTheOpIsNamed) {
  TraceBuilder b;
  const std::string site = "/venv/lib/python3.11/site-packages/";
  auto x = b.Leaf({4, 8});
  // A frame nothing could name (an unsymbolized one) is nobody's line, not the user frame.
  auto saved_at = b.Stack({{"", 0, "", false},
                           {site + "torch/nn/modules/module.py", 1775, "_call_impl", true},
                           {site + "transformers/activations.py", 103, "SiLUActivation.forward",
                            true},
                           {site + "transformers/trainer.py", 2000, "Trainer.train", true},
                           {"train.py", 21, "<module>", false}});
  auto y = b.Forward("aten::silu", "SiluBackward0", {x}, {{"self", x}}, saved_at);
  b.Inplace("aten::mul_", x, {}, b.At(11, "train.py", "scale_hook"), false);
  b.Backward({y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  ASSERT_TRUE(v.victim && v.victim->user_frame);
  EXPECT_EQ(v.victim->user_frame->line, 21u);
  const std::string text = FormatText(report, /*color=*/false);
  const std::string library =
      "= run inside transformers/activations.py:103 in SiLUActivation.forward";
  const size_t at = text.find(library);
  EXPECT_NE(at, std::string::npos) << text;
  EXPECT_GT(at, text.find("note: saved here by aten::silu")) << text;  // The victim's, only.
  EXPECT_EQ(text.find("run inside", at + library.size()), std::string::npos) << text;
}

// The in-place op runs two helper calls deep: torch's frames, then helpers.py, then train.py.
TEST(AnalyzerTest, UserFrameIsTheFirstNonFrameworkFrame) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto stack = b.Stack({{"torch/_tensor.py", 40, "wrapped", true},
                        {"torch/overrides.py", 1600, "handle", true},
                        {"helpers.py", 5, "scale_inplace", false},
                        {"helpers.py", 9, "normalize", false},
                        {"train.py", 12, "forward", false}});
  b.Inplace("aten::mul_", y.out, {}, stack, false);
  b.Backward({y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const OpRef& culprit = *report.violations[0].culprit;
  ASSERT_TRUE(culprit.user_frame);
  EXPECT_EQ(culprit.user_frame->file, "helpers.py");
  EXPECT_EQ(culprit.user_frame->line, 5u);
  EXPECT_EQ(culprit.user_frame->function, "scale_inplace");
  EXPECT_EQ(culprit.stack.size(), 5u);
  EXPECT_TRUE(culprit.stack[0].framework);
}

// aten::relu_ runs aten::clamp_min_ inside: the write is the outer op's (the one the user called),
// with the inner one as detail; a user scope around both does not take it.
TEST(AnalyzerTest, NestedInPlaceOpIsAttributedToTheOutermostFunction) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto scope = b.NewId();
  auto outer = b.NewId();
  uint32_t v0 = b.Version(y.out);
  // Nested in an ATen op: no stack of its own (the recorder gives none).
  auto inner = b.Op({.name = "aten::clamp_min_", .inputs = {y.out}, .outputs = {y.out},
                     .writes = {y.out}, .parent = outer});
  b.Op({.name = "aten::relu_", .inputs = {y.out}, .outputs = {y.out},
        .started_at = {{y.out, v0}}, .id = outer, .parent = scope, .stack = b.At(40)});
  b.Op({.name = "my_block", .inputs = {y.out}, .started_at = {{y.out, v0}}, .id = scope,
        .scope = format::OpScope::kUserScope});
  b.Backward({y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.culprit->id, outer);
  EXPECT_EQ(v.culprit->name, "aten::relu_");
  EXPECT_EQ(v.culprit->detail, "aten::clamp_min_");
  EXPECT_TRUE(v.culprit->function.empty());  // In a user's range: no Function's op.
  EXPECT_FALSE(v.culprit->called_from);
  EXPECT_TRUE(v.later_culprits.empty());
  EXPECT_EQ(report.version_bumps, 1u);
  (void)inner;
}

// A Python Function's forward writes in place (`logits -= logits.max(...)`): the recorder gives
// the ops its forward calls stacks of their own, so the write is named at its line in forward,
// with the Function and the apply() call's line as context, not as the apply op.
TEST(AnalyzerTest, AWriteInsideAFunctionsForwardIsNamedAtItsOwnLine) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto apply = b.NewId();
  uint32_t v0 = b.Version(y.out);
  const format::InternId in_forward = b.Stack({{"train.py", 20, "XEntropy.forward", false},
                                       {"train.py", 31, "<module>", false}});
  b.Op({.name = "aten::sub_", .inputs = {y.out}, .outputs = {y.out}, .writes = {y.out},
        .parent = apply, .stack = in_forward, .grad_mode = false});
  b.Op({.name = "XEntropy", .inputs = {y.out}, .started_at = {{y.out, v0}}, .id = apply,
        .stack = b.At(31, "train.py", "<module>"), .sequence_nr = 7});
  b.Backward({y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const OpRef& culprit = *report.violations[0].culprit;
  EXPECT_EQ(culprit.name, "aten::sub_");
  EXPECT_TRUE(culprit.detail.empty());
  ASSERT_TRUE(culprit.user_frame);
  EXPECT_EQ(culprit.user_frame->line, 20u);
  EXPECT_EQ(culprit.function, "XEntropy");
  EXPECT_FALSE(culprit.in_function_backward);
  ASSERT_TRUE(culprit.called_from);
  EXPECT_EQ(culprit.called_from->line, 31u);
}

// A Function keeps a weight on its ctx (`ctx.w = w`, unchecked), and the program refills it
// before backward: silent where the Function's backward read it, nothing where it never did.
TEST(AnalyzerTest, AWriteToACtxStashIsSilentOnlyWhereBackwardReadsIt) {
  for (bool read : {true, false}) {
    TraceBuilder b;
    auto x = b.Leaf({4, 8});
    auto w = b.Tensor({8, 8});
    auto y = b.Forward("Scale", "ScaleBackward", {x},
                       {{.name = "ctx.w", .tensor = w, .checked = false}}, b.At(10));
    b.Inplace("aten::copy_", w, {}, b.At(11));
    b.BackwardReading(y.node, {read ? w : x});
    Report report = Analyze(b.records);
    if (!read) {
      EXPECT_TRUE(report.violations.empty());
      continue;
    }
    ASSERT_EQ(report.violations.size(), 1u);
    const Violation& v = report.violations[0];
    EXPECT_EQ(v.kind, ViolationKind::kSilent);
    EXPECT_EQ(v.evidence, SilentEvidence::kUncheckedSave);
    EXPECT_EQ(v.tensor.saved_name, "ctx.w");
    ASSERT_TRUE(v.culprit && v.culprit->user_frame);
    EXPECT_EQ(v.culprit->user_frame->line, 11u);
    EXPECT_FALSE(v.pytorch_raised);
  }
}

// Reentrant checkpointing runs the block again in backward with the weights as they are then:
// a weight the block read in forward and the program scaled before backward is a silent
// violation of the checkpoint's node; one the block wrote itself (BatchNorm's running statistics)
// is not.
TEST(AnalyzerTest, AWeightWrittenBeforeAReentrantRecomputationIsSilent) {
  for (bool block_writes_it : {false, true}) {
    TraceBuilder b;
    auto x = b.Leaf({4, 8});
    auto w = b.Tensor({8, 8});
    auto h = b.Tensor({4, 8});
    std::vector<format::ObjectId> writes;
    if (block_writes_it) writes.push_back(w);
    auto ckpt = b.FunctionApply(
        "CheckpointFunction", {x}, {{.name = "saved_tensors", .tensor = x}}, b.At(19),
        {{.name = "aten::mm", .inputs = {x, w}, .outputs = {h}, .writes = writes,
          .stack = b.At(14), .grad_mode = false}});
    b.Inplace("aten::mul_", w, {}, b.At(21), /*grad_mode=*/false);
    b.Backward({ckpt.node});
    Report report = Analyze(b.records);
    if (block_writes_it) {
      EXPECT_TRUE(report.violations.empty());
      continue;
    }
    ASSERT_EQ(report.violations.size(), 1u);
    const Violation& v = report.violations[0];
    EXPECT_EQ(v.kind, ViolationKind::kSilent);
    EXPECT_TRUE(v.read_by_recompute);
    EXPECT_EQ(v.backward_node.name, "CheckpointFunctionBackward");
    ASSERT_TRUE(v.culprit && v.culprit->user_frame && v.victim && v.victim->user_frame);
    EXPECT_EQ(v.culprit->user_frame->line, 21u);
    EXPECT_EQ(v.victim->name, "CheckpointFunction");
    EXPECT_EQ(v.victim->user_frame->line, 19u);
  }
}

// v = y[0]; v.mul_(2): the view shares y's counter, so the version check catches it.
TEST(AnalyzerTest, WriteThroughAViewBumpsTheSharedCounter) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto row = b.View(y.out, {8}, {1}, 0);
  auto write = b.Inplace("aten::mul_", row, {}, b.At(13), false);
  b.Backward({y.node}, y.node);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  EXPECT_EQ(report.violations[0].kind, ViolationKind::kVersion);
  EXPECT_EQ(report.violations[0].culprit->id, write);
  EXPECT_EQ(report.violations[0].tensor.id, y.out);
}

// y.data.mul_(2): same storage, another counter: PyTorch stays silent, the replayer does not.
TEST(AnalyzerTest, WriteThroughDataIsASilentViolation) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto data = b.Data(y.out);
  auto write = b.Inplace("aten::mul_", data, {}, b.At(14), false);
  b.Backward({y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.culprit->id, write);
  EXPECT_EQ(Line(v.culprit), 14u);
  EXPECT_EQ(Line(v.victim), 11u);
  EXPECT_EQ(v.saved_version, v.current_version);
  EXPECT_FALSE(v.pytorch_raised);
}

// x @ w, saving w, a wrapper subclass (a DTensor) over a shard: (shard, w, the mm).
std::tuple<format::ObjectId, format::ObjectId, Forwarded> SaveAWrapper(TraceBuilder& b) {
  auto shard = b.Tensor({8, 8});
  auto w = b.Wrapper(shard);
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::mm", "MmBackward0", {x, w}, {{"self", x}, {"mat2", w}}, b.At(11));
  return {shard, w, y};
}

// A DTensor saved by mm, its shard written under no_grad (`w.to_local().mul_(2)`): the shard's
// counter moves, the DTensor's does not, PyTorch stays silent and backward reads the new values.
TEST(AnalyzerTest, WriteThroughAWrappersInnerTensorIsASilentViolation) {
  TraceBuilder b;
  auto [shard, w, y] = SaveAWrapper(b);
  auto write = b.Inplace("aten::mul_", shard, {}, b.At(14), false);
  b.Backward({y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.culprit->id, write);
  EXPECT_EQ(Line(v.victim), 11u);
  EXPECT_EQ(v.tensor.id, w);
  EXPECT_FALSE(v.pytorch_raised);
}

// The DTensor's own in-place op writes its shard inside it (DTensor's __torch_dispatch__) and moves
// the DTensor's counter: one violation, the version check's, not a second silent one.
TEST(AnalyzerTest, AWrappersOwnInplaceOpIsOneVersionViolation) {
  TraceBuilder b;
  auto [shard, w, y] = SaveAWrapper(b);
  const format::ObjectId outer = b.NewId();
  b.Op({.name = "aten::mul_", .inputs = {shard}, .outputs = {shard}, .writes = {shard},
        .parent = outer, .grad_mode = false});
  b.Op({.name = "aten::mul_", .inputs = {w}, .outputs = {w}, .writes = {w}, .id = outer,
        .stack = b.At(14), .grad_mode = false});
  b.Backward({y.node}, y.node,
             "one of the variables needed for gradient computation has been modified by an "
             "inplace operation");
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  EXPECT_EQ(report.violations[0].kind, ViolationKind::kVersion);
  EXPECT_EQ(report.violations[0].culprit->id, outer);
}

// A write to the shard after backward used the DTensor (the optimizer's) is fine.
TEST(AnalyzerTest, AWrappersInnerWrittenAfterUseIsFine) {
  TraceBuilder b;
  auto [shard, w, y] = SaveAWrapper(b);
  b.Backward({y.node});
  b.Inplace("aten::add_", shard, {}, b.At(14), false);
  EXPECT_TRUE(Analyze(b.records).violations.empty());
}

// Writes through .data that miss the saved bytes, or land after the node ran, are fine.
TEST(AnalyzerTest, SilentWritesOutsideTheSavedBytesOrAfterUseAreFine) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto base = b.Tensor({8});
  auto head = b.View(base, {4}, {1}, 0);   // Saved: bytes [0, 16).
  auto tail = b.View(base, {4}, {1}, 4);   // Written: bytes [16, 32).
  auto y = b.Forward("aten::mul", "MulBackward0", {head, x}, {{"self", head}}, b.At(11), {4});
  auto tail_data = b.Data(tail);
  b.Inplace("aten::zero_", tail_data, {}, b.At(12), false);
  b.Backward({y.node});
  b.Inplace("aten::zero_", b.Data(head), {}, b.At(13), false);
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
}

// --verify-saved: y = x.sigmoid(); y.detach().numpy()[:] = 0; backward. No op wrote y, but its
// bytes' fingerprint changed: a silent write, with the detach() that made the alias as candidate.
TEST(AnalyzerTest, FingerprintChangeWithNoRecordedWriteIsSilent) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  b.FingerprintAtSave(y.node, "result", 0x1111);
  auto other = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(12));
  b.FingerprintAtSave(other.node, "result", 0x3333);
  const format::TensorInfo info = b.Info(y.out);
  auto alias = b.View(y.out, info.shape, info.strides, 0);
  auto detach = b.Op({.name = "aten::detach", .inputs = {y.out}, .outputs = {alias},
                      .stack = b.At(13)});
  b.Op({.name = "aten::mul", .inputs = {y.out, x}, .outputs = {b.Tensor({4, 8})},
        .stack = b.At(14)});  // Reads y: not a candidate.
  b.FingerprintAtUse(y.node, "result", 0x2222);
  b.FingerprintAtUse(other.node, "result", 0x3333);  // Unchanged: fine.
  b.Backward({other.node, y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.evidence, SilentEvidence::kFingerprint);
  EXPECT_FALSE(v.culprit.has_value());
  EXPECT_EQ(Line(v.victim), 11u);
  EXPECT_EQ(v.backward_node.name, "SigmoidBackward0");
  ASSERT_TRUE(v.fingerprint.has_value());
  EXPECT_EQ(v.fingerprint->at_save, 0x1111u);
  EXPECT_EQ(v.fingerprint->at_use, 0x2222u);
  ASSERT_EQ(v.candidates.size(), 1u);
  EXPECT_EQ(v.candidates[0].op.id, detach);
  EXPECT_FALSE(v.candidates[0].wrote);
  EXPECT_EQ(v.candidates[0].op.user_frame->line, 13u);
  EXPECT_FALSE(v.pytorch_raised);
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("candidate: aten::detach made a tensor over them at train.py:13"),
            std::string::npos) << text;
  EXPECT_NE(text.find("0000000000001111 at save, 0000000000002222 at use"), std::string::npos)
      << text;
  nlohmann::json j = ToJson(report)["violations"][0];
  EXPECT_EQ(j["evidence"], "fingerprint");
  EXPECT_EQ(j["fingerprint"]["at_save"], "0x0000000000001111");
  EXPECT_EQ(j["candidates"][0]["role"], "aliased");
  EXPECT_EQ(j["candidates"][0]["op"], "aten::detach");
}

// A version violation whose bytes changed too is reported once, as the version violation, with
// the fingerprints; a write through .data keeps its own evidence.
TEST(AnalyzerTest, FingerprintsExplainedByARecordedWriteAddNoViolation) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  b.FingerprintAtSave(y.node, "result", 1);
  b.Inplace("aten::mul_", y.out, {}, b.At(12));
  auto z = b.Forward("aten::tanh", "TanhBackward0", {x}, {{"result", kOutput}}, b.At(13));
  b.FingerprintAtSave(z.node, "result", 5);
  b.Inplace("aten::zero_", b.Data(z.out), {}, b.At(14), false);
  b.FingerprintAtUse(y.node, "result", 2);
  b.FingerprintAtUse(z.node, "result", 6);
  b.Backward({z.node, y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 2u) << FormatText(report, false);
  for (const Violation& v : report.violations) {
    ASSERT_TRUE(v.fingerprint.has_value());
    EXPECT_TRUE(v.candidates.empty());
    ASSERT_TRUE(v.culprit.has_value());
    if (v.kind == ViolationKind::kVersion) {
      EXPECT_EQ(Line(v.culprit), 12u);
      EXPECT_EQ(v.evidence, SilentEvidence::kNone);
    } else {
      EXPECT_EQ(Line(v.culprit), 14u);
      EXPECT_EQ(v.evidence, SilentEvidence::kAliasedWrite);
    }
  }
}

// An extension writes a saved tensor through torch::from_blob over its data_ptr(): another storage,
// another counter, the same memory. With addresses in the trace (--verify-saved), that write is
// named as a candidate that wrote.
TEST(AnalyzerTest, WriteThroughAnotherStorageOverTheSameMemoryIsACandidate) {
  TraceBuilder b;
  b.addresses = true;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  b.FingerprintAtSave(y.node, "result", 1);
  auto elsewhere = b.Tensor({4, 8});  // Another storage, other memory: not a candidate.
  b.Inplace("aten::zero_", elsewhere, {}, b.At(12), false);
  auto alias = b.Alias(y.out);
  auto write = b.Inplace("aten::mul_", alias, {}, b.At(13), false);
  b.FingerprintAtUse(y.node, "result", 2);
  b.Backward({y.node});
  b.Inplace("aten::mul_", alias, {}, b.At(14), false);  // After the use: fine.
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.evidence, SilentEvidence::kFingerprint);
  ASSERT_EQ(v.candidates.size(), 1u);
  EXPECT_EQ(v.candidates[0].op.id, write);
  EXPECT_TRUE(v.candidates[0].wrote);
  ASSERT_TRUE(v.culprit.has_value());  // It did write the saved bytes: the culprit.
  EXPECT_EQ(v.culprit->id, write);
  EXPECT_EQ(Line(v.culprit), 13u);
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("--> train.py:13"), std::string::npos) << text;
  EXPECT_NE(text.find("wrote into its memory through another tensor over it"), std::string::npos)
      << text;
}

// A raw CUDA kernel launched outside any op, between the save and the use, is a candidate.
TEST(AnalyzerTest, KernelsOutsideOpsBetweenSaveAndUseAreCandidates) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  format::CudaKernelRecord early;
  early.name = b.Str("early_kernel");
  early.start_ns = early.end_ns = b.Now();
  b.records.push_back(early);
  b.FingerprintAtSave(y.node, "result", 1);
  format::CudaKernelRecord raw;
  raw.name = b.Str("scribble_kernel");
  raw.start_ns = raw.end_ns = b.Now();
  b.records.push_back(raw);
  format::CudaKernelRecord inside = raw;  // Launched by an op: that op's work.
  inside.op = y.op;
  inside.name = b.Str("sigmoid_kernel");
  b.records.push_back(inside);
  b.FingerprintAtUse(y.node, "result", 2);
  b.Backward({y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  ASSERT_EQ(v.kernels.size(), 1u);
  EXPECT_EQ(v.kernels[0].name, "scribble_kernel");
  EXPECT_NE(FormatText(report, false).find("candidate: scribble_kernel on cuda:0, launched "
                                           "outside any op"),
            std::string::npos);
}

// s = x.sigmoid(); e = s.exp(); e.mul_(2); s.add_(1); e.sum().backward(): ExpBackward0 throws;
// SigmoidBackward0 never runs, but would throw next: the rest of the pass is simulated.
TEST(AnalyzerTest, BackwardThatThrewPartWaySimulatesTheRest) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto s = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto e = b.Forward("aten::exp", "ExpBackward0", {s.out}, {{"result", kOutput}}, b.At(12));
  auto mul = b.Inplace("aten::mul_", e.out, {}, b.At(13), false);
  auto add = b.Inplace("aten::add_", s.out, {}, b.At(14), false);
  auto loss = b.Forward("aten::sum", "SumBackward0", {e.out}, {}, b.At(15), {});
  b.Backward({loss.node, e.node}, e.node,
             "one of the variables needed for gradient computation has been modified by an "
             "inplace operation: [torch.FloatTensor [4, 8]], which is output 0 of ExpBackward0, "
             "is at version 1; expected version 0 instead.");
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 2u);
  EXPECT_EQ(report.violations[0].backward_node.name, "ExpBackward0");
  EXPECT_EQ(report.violations[0].culprit->id, mul);
  EXPECT_TRUE(report.violations[0].pytorch_raised);
  EXPECT_FALSE(report.violations[0].simulated);
  EXPECT_EQ(report.violations[1].backward_node.name, "SigmoidBackward0");
  EXPECT_EQ(report.violations[1].culprit->id, add);
  EXPECT_TRUE(report.violations[1].simulated);
  EXPECT_FALSE(report.violations[1].pytorch_raised);
  EXPECT_EQ(report.violations[1].node_exec_op, 0u);
}

// PyTorch stops at the first node that throws even when an earlier node had a silent problem.
TEST(AnalyzerTest, TheViolationPyTorchStoppedAtComesFirst) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto s = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto e = b.Forward("aten::exp", "ExpBackward0", {s.out}, {{"result", kOutput}}, b.At(12));
  b.Inplace("aten::mul_", b.Data(e.out), {}, b.At(13), false);  // Silent, found first.
  b.Inplace("aten::add_", s.out, {}, b.At(14), false);
  b.Backward({e.node, s.node}, s.node, kSigmoidMessage);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 2u);
  EXPECT_EQ(report.violations[0].kind, ViolationKind::kVersion);
  EXPECT_EQ(Line(report.violations[0].culprit), 14u);
  EXPECT_TRUE(report.violations[0].pytorch_raised);
  EXPECT_EQ(report.violations[1].kind, ViolationKind::kSilent);
}

// --- Legal programs report nothing ---------------------------------------------------------------

TEST(AnalyzerTest, InPlaceBeforeTheSaveIsFine) {
  TraceBuilder b;
  auto x = b.Leaf({3});
  auto w = b.Leaf({3});
  auto a = b.Forward("aten::exp", "ExpBackward0", {x}, {}, b.At(20));
  auto scaled = b.InplaceForward("aten::mul_", "MulBackward1", a.out, {}, b.At(21));
  auto z = b.Forward("aten::mul", "MulBackward0", {a.out, w}, {{"self", a.out}, {"other", w}},
                     b.At(22));
  auto loss = b.Forward("aten::sum", "SumBackward0", {z.out}, {}, b.At(23), {});
  b.Backward({loss.node, z.node, scaled.node, a.node});
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  EXPECT_EQ(report.version_bumps, 1u);
}

TEST(AnalyzerTest, InPlaceOnATensorNoNodeSavedIsFine) {
  TraceBuilder b;
  auto x = b.Leaf({3});
  auto t = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(20));
  auto u = b.Forward("aten::add", "AddBackward0", {t.out}, {}, b.At(21));
  auto scaled = b.InplaceForward("aten::mul_", "MulBackward1", u.out, {}, b.At(22));
  auto loss = b.Forward("aten::sum", "SumBackward0", {u.out}, {}, b.At(23), {});
  b.Backward({loss.node, scaled.node, u.node, t.node});
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
}

// Training steps: a fresh graph each step, the optimizer's update after backward ran.
TEST(AnalyzerTest, UpdatesAfterBackwardAndAFreshGraphPerStepAreFine) {
  TraceBuilder b;
  auto w = b.Leaf({4, 3});
  for (int step = 0; step < 3; ++step) {
    auto x = b.Tensor({2, 4});
    auto z = b.Forward("aten::mm", "MmBackward0", {x, w}, {{"self", x}, {"mat2", w}}, b.At(30),
                       {2, 3});
    auto loss = b.Forward("aten::sum", "SumBackward0", {z.out}, {}, b.At(31), {});
    b.Backward({loss.node, z.node, b.AccumulateGradOf(w)});
    b.Inplace("aten::sub_", w, {}, b.At(32, "optim.py", "step"), /*grad_mode=*/false);
  }
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  EXPECT_EQ(report.backward_passes, 3u);
  EXPECT_EQ(report.node_executions, 9u);
}

TEST(AnalyzerTest, SavedTensorHooksSkipTheCheckAsPyTorchDoes) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x},
                     {{"result", kOutput, /*has_hooks=*/true}}, b.At(11));
  b.Inplace("aten::mul_", y.out, {}, b.At(12), false);
  b.Backward({y.node});
  EXPECT_TRUE(Analyze(b.records).violations.empty());
}

// backward(retain_graph=True) twice with no forward in between: two passes, not one.
TEST(AnalyzerTest, RetainedGraphRunTwiceIsTwoPasses) {
  TraceBuilder b;
  auto x = b.Leaf({3});
  auto y = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(20));
  b.Backward({y.node, b.AccumulateGradOf(x)});
  b.Backward({y.node, b.AccumulateGradOf(x)});
  Report report = Analyze(b.records);
  EXPECT_EQ(report.backward_passes, 2u);
  EXPECT_TRUE(report.violations.empty());
}

// --- Output ----------------------------------------------------------------------------------------

TEST(ReportTest, JsonHasTheDocumentedKeys) {
  SigmoidMulProgram p;
  nlohmann::json j = ToJson(Analyze(p.b.records));
  EXPECT_EQ(j["schema_version"], kSchemaVersion);
  EXPECT_EQ(j["ops"], 6);
  ASSERT_EQ(j["violations"].size(), 1u);
  const auto& v = j["violations"][0];
  for (const char* key : {"kind", "culprit", "later_culprits", "victim", "backward_node",
                          "saved_version", "current_version", "tensor", "pytorch_raised",
                          "pytorch_message", "pytorch_names", "simulated", "backward_pass"}) {
    EXPECT_TRUE(v.contains(key)) << key;
  }
  EXPECT_EQ(v["kind"], "version");
  EXPECT_EQ(v["culprit"]["op"], "aten::mul_");
  EXPECT_EQ(v["culprit"]["user_frame"]["file"], "train.py");
  EXPECT_EQ(v["culprit"]["user_frame"]["line"], 12);
  EXPECT_EQ(v["culprit"]["user_frame"]["function"], "forward");
  EXPECT_TRUE(v["culprit"]["stack"].is_array());
  EXPECT_EQ(v["victim"]["op"], "aten::sigmoid");
  EXPECT_EQ(v["victim"]["user_frame"]["line"], 11);
  EXPECT_EQ(v["backward_node"]["name"], "SigmoidBackward0");
  EXPECT_EQ(v["saved_version"], 0);
  EXPECT_EQ(v["current_version"], 1);
  EXPECT_EQ(v["tensor"]["shape"], nlohmann::json::array({4, 8}));
  EXPECT_EQ(v["tensor"]["dtype"], "float32");
  EXPECT_EQ(v["tensor"]["device"], "cpu");
  EXPECT_EQ(v["tensor"]["name"], "result");
  EXPECT_EQ(v["pytorch_raised"], true);
  EXPECT_EQ(v["pytorch_message"], kSigmoidMessage);
  EXPECT_EQ(v["pytorch_names"], "output 0 of SigmoidBackward0");
}

TEST(ReportTest, TextLeadsWithTheCulpritAndQuotesTheSource) {
  std::string path = ::testing::TempDir() + "/torchrr_replayer_train.py";
  {
    std::ofstream out(path);
    for (int i = 1; i <= 20; ++i) {
      if (i == 11) {
        out << "    y = torch.sigmoid(x)\n";
      } else if (i == 12) {
        out << "    y.mul_(2)\n";
      } else {
        out << "# line " << i << "\n";
      }
    }
  }
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}},
                     b.At(11, path));
  b.Inplace("aten::mul_", y.out, {}, b.At(12, path), false);
  b.Backward({y.node}, y.node, kSigmoidMessage);
  // The file is read from this machine (the trace carries no code): a source file under a root.
  SetLocalSourceRoots({::testing::TempDir()});
  std::string text = FormatText(Analyze(b.records), /*color=*/false);
  SetLocalSourceRoots({});
  size_t error = text.find("error: saved tensor modified in place");
  size_t culprit = text.find("--> " + path + ":12 in forward");
  size_t quote = text.find("y.mul_(2)");
  size_t victim = text.find("note: saved here by aten::sigmoid at " + path + ":11");
  EXPECT_NE(error, std::string::npos) << text;
  EXPECT_NE(culprit, std::string::npos) << text;
  EXPECT_NE(quote, std::string::npos) << text;
  EXPECT_NE(victim, std::string::npos) << text;
  EXPECT_LT(error, culprit);
  EXPECT_LT(culprit, victim);
  EXPECT_NE(text.find("torch.sigmoid(x)"), std::string::npos) << text;
  EXPECT_NE(text.find("SigmoidBackward0"), std::string::npos);
  // Written under no_grad: out of place, y would lose its history.
  EXPECT_NE(text.find("help: move the write after backward()"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_NE(FormatText(Analyze(b.records), /*color=*/true).find('\x1b'), std::string::npos);
  std::remove(path.c_str());
}

// With grad mode on, making the write out of place keeps the tensor in its graph: that is the
// help; under no_grad (an optimizer step, a weight update) it is to move the write instead.
TEST(ReportTest, HelpFollowsTheCulpritsGradMode) {
  for (bool grad_mode : {true, false}) {
    TraceBuilder b;
    auto x = b.Leaf({4, 8});
    auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
    b.Inplace("aten::mul_", y.out, {}, b.At(12), grad_mode);
    b.Backward({y.node}, y.node, kSigmoidMessage);
    const std::string text = FormatText(Analyze(b.records), /*color=*/false);
    const std::string help = grad_mode ? "help: make aten::mul_ out of place (aten::mul), or "
                                         ".clone() the tensor before modifying it"
                                       : "help: move the write after backward() (a parameter's "
                                         "or buffer's update), or .clone() the tensor where it is "
                                         "made";
    EXPECT_NE(text.find(help), std::string::npos) << text;
  }
}

TEST(ReportTest, NothingToReportSaysSo) {
  TraceBuilder b;
  auto x = b.Leaf({3});
  auto y = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(20));
  b.Backward({y.node});
  EXPECT_NE(FormatText(Analyze(b.records), false).find("no saved tensor was modified"),
            std::string::npos);
}

// torch 2.13 changed "output 0 of SigmoidBackward0" to "output 0 of Sigmoid" in its message.
TEST(AnalyzerTest, PytorchNamesAsTheRecordingTorchWordsThem) {
  {
    SigmoidMulProgram p;
    Analyzer analyzer;
    for (const auto& record : p.b.records) analyzer.Add(record);
    analyzer.SetRecordingTorch("2.15.0+cu130");
    Report report = analyzer.Finish();
    ASSERT_EQ(report.violations.size(), 1u);
    EXPECT_EQ(report.violations[0].pytorch_names, "output 0 of Sigmoid");
  }
  for (const char* older : {"2.12.1", "2.9.1+cu128", "", "nightly"}) {
    SigmoidMulProgram p;
    Analyzer analyzer;
    for (const auto& record : p.b.records) analyzer.Add(record);
    analyzer.SetRecordingTorch(older);
    Report report = analyzer.Finish();
    ASSERT_EQ(report.violations.size(), 1u);
    EXPECT_EQ(report.violations[0].pytorch_names, "output 0 of SigmoidBackward0") << older;
  }
  EXPECT_EQ(PytorchNodeName("FBackward", "2.13.0"), "F");
  EXPECT_EQ(PytorchNodeName("ClampBackward1", "2.15.0"), "Clamp1");
  EXPECT_EQ(PytorchNodeName("AddBackward10", "2.15.0"), "Add10");
  EXPECT_EQ(PytorchNodeName("AsStridedBackward0", "2.13.0"), "AsStrided");
  EXPECT_EQ(PytorchNodeName("CopySlices", "2.15.0"), "CopySlices");
  EXPECT_EQ(PytorchNodeName("MyBackwardPass", "2.15.0"), "MyBackwardPass");
  EXPECT_EQ(PytorchNodeName("torch::autograd::CopySlices", "3.0.0"),
            "torch::autograd::CopySlices");
  EXPECT_EQ(PytorchNodeName("SigmoidBackward0", "2.12.9"), "SigmoidBackward0");
}

TEST(AnalyzerTest, StreamingMatchesInMemory) {
  SigmoidMulProgram p;
  Analyzer analyzer;
  for (const auto& record : p.b.records) analyzer.Add(record);
  EXPECT_EQ(ToJson(analyzer.Finish()), ToJson(Analyze(p.b.records)));
}

#ifdef TORCHRR_HAVE_FORMAT
// The same program written as a trace file and read back gives the same report.
TEST(AnalyzerTest, RoundTripThroughTheTraceFormat) {
  SigmoidMulProgram p;
  std::string bytes;
  {
    auto writer = format::TraceWriter::ToString(&bytes, format::FileInfo{});
    for (const auto& record : p.b.records) ASSERT_TRUE(writer->Append(record).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  Analyzer analyzer;
  format::ReadSummary summary =
      format::ReadTraceBytes(bytes, [&](const format::Record& r) { analyzer.Add(r); });
  ASSERT_TRUE(summary.status.ok()) << summary.status.message();
  EXPECT_EQ(ToJson(analyzer.Finish()), ToJson(Analyze(p.b.records)));
}
#endif

}  // namespace
}  // namespace torchrr::replayer
