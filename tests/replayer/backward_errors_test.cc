// The errors backward raises for reasons other than a version bump (a saved input detached in
// place, a graph run a second time, an unpack hook's tensor), a version counter set back, the
// pass rule with several threads calling backward at once, and an error the program ends with
// that is none of these; on record sequences shaped like the recorder's (trace_builder.h).
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "torchrr/replayer/replayer.h"
#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using format::ObjectId;
using testing::Forwarded;
using testing::kFloat32;
using testing::kOutput;
using testing::Line;
using testing::TraceBuilder;

constexpr char kDetachedMessage[] =
    "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_().This is "
    "not supported, please use out-of-place `.detach()` instead";
constexpr char kFreedMessage[] =
    "Trying to backward through the graph a second time (or directly access saved tensors after "
    "they have already been freed).";
constexpr char kSizeMessage[] =
    "The size of tensor a (8) must match the size of tensor b (4) at non-singleton dimension 0";
constexpr format::DType kInt32 = 3;    // c10::ScalarType::Int
constexpr format::DType kFloat16 = 5;  // c10::ScalarType::Half

// a = x * 2; b = a.sin(); a.detach_(); b.sum().backward()
struct DetachProgram {
  TraceBuilder b;
  Forwarded a, sin, loss;
  ObjectId detach = 0;

  // `before_save`: a.detach_() runs before sin() saves a (it then saves a leaf: legal).
  explicit DetachProgram(bool before_save = false) {
    auto x = b.Leaf({8});
    a = b.Forward("aten::mul", "MulBackward0", {x}, {}, b.At(10));
    if (before_save) detach = DetachIt();
    sin = b.Forward("aten::sin", "SinBackward0", {a.out}, {{"self", a.out}}, b.At(11));
    if (!before_save) detach = DetachIt();
    loss = b.Forward("aten::sum", "SumBackward0", {sin.out}, {}, b.At(13), {});
  }

  ObjectId DetachIt() {
    ObjectId op = b.Op({.name = "aten::detach_", .inputs = {a.out}, .outputs = {a.out},
                        .stack = b.At(12)});
    format::TensorInfo& t = b.Info(a.out);
    t.grad_fn = 0;
    t.is_leaf = true;
    t.requires_grad = false;
    b.records.push_back(t);
    return op;
  }
};

TEST(DetachedTest, DetachInPlaceOfASavedInputIsTheCulprit) {
  DetachProgram p;
  p.b.Backward({p.loss.node, p.sin.node}, p.sin.node);
  p.b.PythonError(kDetachedMessage);
  Report report = Analyze(p.b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kDetached);
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->id, p.detach);
  EXPECT_EQ(v.culprit->name, "aten::detach_");
  EXPECT_EQ(Line(v.culprit), 12u);
  EXPECT_EQ(Line(v.victim), 11u);
  EXPECT_EQ(v.backward_node.name, "SinBackward0");
  EXPECT_TRUE(v.pytorch_raised);
  EXPECT_EQ(v.pytorch_message, kDetachedMessage);
  EXPECT_TRUE(report.unexplained_errors.empty());
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("error: saved tensor detached in place"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::detach_ detached it from its graph in place"), std::string::npos);
  EXPECT_EQ(ToJson(report)["violations"][0]["kind"], "detached");
}

TEST(DetachedTest, DetachBeforeTheSaveIsFine) {
  DetachProgram p(/*before_save=*/true);
  p.b.Backward({p.loss.node, p.sin.node});
  Report report = Analyze(p.b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
}

// e = x.exp(); f = e * 3; e.detach_(): exp saved its output, which autograd unpacks with its
// own node: no error.
TEST(DetachedTest, DetachInPlaceOfASavedOutputIsFine) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto e = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(10));
  auto f = b.Forward("aten::mul", "MulBackward1", {e.out}, {}, b.At(11));
  b.Op({.name = "aten::detach_", .inputs = {e.out}, .outputs = {e.out}, .stack = b.At(12)});
  b.Backward({f.node, e.node});
  EXPECT_TRUE(Analyze(b.records).violations.empty());
}

// y = x.sigmoid(); loss = y.sum(); loss.backward(); loss.backward()
struct TwiceProgram {
  TraceBuilder b;
  Forwarded y, loss;

  TwiceProgram() {
    auto x = b.Leaf({8});
    y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
    loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(11), {});
  }

  // The ones_like that Tensor.backward() runs for an implicit gradient, called from `line`.
  void BackwardCall(uint32_t line) {
    auto stack = b.Stack({{"torch/autograd/__init__.py", 231, "_make_grads", true},
                          {"torch/autograd/__init__.py", 374, "backward", true},
                          {"torch/_tensor.py", 631, "Tensor.backward", true},
                          {"train.py", line, "<module>", false}});
    b.Op({.name = "aten::ones_like", .inputs = {loss.out}, .outputs = {b.Tensor({})},
          .stack = stack});
  }
};

TEST(FreedTest, TheEarlierBackwardCallIsTheCulprit) {
  TwiceProgram p;
  p.BackwardCall(12);
  p.b.Backward({p.loss.node, p.y.node});
  p.BackwardCall(13);
  p.b.Backward({p.loss.node, p.y.node}, p.y.node);
  p.b.PythonError(kFreedMessage);
  Report report = Analyze(p.b.records);
  EXPECT_EQ(report.backward_passes, 2u);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kFreed);
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->name, "SigmoidBackward0");
  EXPECT_EQ(Line(v.culprit), 12u);
  EXPECT_EQ(v.freed_by_pass, 0u);
  EXPECT_EQ(v.backward_pass, 1u);
  EXPECT_EQ(Line(v.victim), 10u);
  EXPECT_EQ(v.backward_node.name, "SigmoidBackward0");
  EXPECT_TRUE(v.pytorch_raised);
  EXPECT_EQ(v.pytorch_message, kFreedMessage);
  EXPECT_TRUE(report.unexplained_errors.empty());
  nlohmann::json j = ToJson(report)["violations"][0];
  EXPECT_EQ(j["kind"], "freed");
  EXPECT_EQ(j["freed_by_pass"], 0);
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("backward pass #0 ran SigmoidBackward0 and freed what it saved"),
            std::string::npos)
      << text;
}

// An explicit gradient made before the first backward() gives no op inside that call: the
// culprit is the earlier execution, with no line.
TEST(FreedTest, WithoutTheBackwardCallTheCulpritHasNoLine) {
  TwiceProgram p;
  p.b.Backward({p.loss.node, p.y.node});
  p.b.Backward({p.loss.node, p.y.node}, p.y.node, kFreedMessage);
  Report report = Analyze(p.b.records);
  ASSERT_EQ(report.violations.size(), 1u);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kFreed);
  ASSERT_TRUE(v.culprit);
  EXPECT_FALSE(v.culprit->user_frame);
  EXPECT_TRUE(v.pytorch_raised);
}

// Another message from a node that ran before is not the freed error.
TEST(FreedTest, AnotherErrorIsNotCalledFreed) {
  TwiceProgram p;
  p.b.Backward({p.loss.node, p.y.node});
  p.b.Backward({p.loss.node, p.y.node}, p.y.node, "something else went wrong");
  Report report = Analyze(p.b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  ASSERT_EQ(report.unexplained_errors.size(), 1u);
  EXPECT_EQ(report.unexplained_errors[0].message, "something else went wrong");
}

TEST(FreedTest, RetainedGraphRunTwiceIsFine) {
  TwiceProgram p;
  p.BackwardCall(12);
  p.b.Backward({p.loss.node, p.y.node});
  p.BackwardCall(13);
  p.b.Backward({p.loss.node, p.y.node});
  Report report = Analyze(p.b.records);
  EXPECT_EQ(report.backward_passes, 2u);
  EXPECT_TRUE(report.violations.empty());
  EXPECT_TRUE(report.unexplained_errors.empty());
}

TEST(UnpackHookTest, BackwardThatFailsOnAHookedSavedTensorNamesTheSave) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x},
                     {{"result", kOutput, /*has_hooks=*/true}}, b.At(10));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(11), {});
  b.Backward({loss.node, y.node}, y.node);
  b.PythonError(kSizeMessage);
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kUnpackHook);
  EXPECT_FALSE(v.culprit);
  EXPECT_EQ(Line(v.victim), 10u);
  EXPECT_EQ(v.tensor.saved_name, "result");
  EXPECT_EQ(v.tensor.id, 0u);  // The hook's, not known; what it packed was the output:
  EXPECT_EQ(v.tensor.shape, std::vector<int64_t>{8});
  EXPECT_EQ(v.tensor.dtype, "float32");
  EXPECT_TRUE(v.pytorch_raised);
  EXPECT_EQ(v.pytorch_message, kSizeMessage);
  EXPECT_EQ(ToJson(report)["violations"][0]["kind"], "unpack_hook");
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("error: backward failed on a saved tensor returned by a saved_tensors_hooks "
                      "unpack hook"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<the unpack hook is not an op: the trace does not show what it returned>"),
            std::string::npos);
  EXPECT_NE(text.find("tensor: float32[8] on cpu"), std::string::npos);
}

// y = sigmoid(x) at line 10, saved through hooks whose unpack hook `function` is defined at
// train.py:`hook_line` (format 1.3); loss = y.sum(); backward, where the sigmoid node's execution
// saw the hook return `unpacked` and, given a message, threw it.
std::vector<format::Record> HookedSigmoid(uint32_t hook_line, const std::string& function,
                                          const format::UnpackedTensor& unpacked,
                                          const char* message) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x},
                     {{"result", kOutput, /*has_hooks=*/true}}, b.At(10));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(11), {});
  const format::InternId hook = b.Stack({{"train.py", hook_line, function, false}});
  b.Backward({loss.node, y.node}, message != nullptr ? y.node : 0);
  if (message != nullptr) b.PythonError(message);
  for (format::Record& r : b.records) {
    if (auto* node = std::get_if<format::NodeRecord>(&r); node && node->node == y.node) {
      node->saved[0].unpack_hook = hook;
    }
    if (auto* exec = std::get_if<format::NodeExecRecord>(&r); exec && exec->node == y.node) {
      exec->unpacked = {unpacked};
    }
  }
  return b.records;
}

// The hook is the culprit, at its definition; the tensor it returned unlike the saved one is the
// one reported.
TEST(UnpackHookTest, TheHooksDefinitionIsTheCulprit) {
  Report report = Analyze(HookedSigmoid(4, "unpack", {0, kFloat16, {4}, kFloat32, {8}},
                                        kSizeMessage));
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kUnpackHook);
  ASSERT_TRUE(v.culprit);
  EXPECT_TRUE(v.culprit->hook);
  EXPECT_EQ(v.culprit->id, 0u);
  EXPECT_EQ(Line(v.culprit), 4u);
  EXPECT_EQ(v.culprit->user_frame->function, "unpack");
  EXPECT_EQ(Line(v.victim), 10u);
  ASSERT_TRUE(v.unpacked);
  EXPECT_EQ(v.unpacked->dtype, "float16");
  EXPECT_EQ(v.unpacked->saved_shape, std::vector<int64_t>{8});
  const nlohmann::json json = ToJson(report)["violations"][0];
  EXPECT_EQ(json["culprit"]["hook"], true);
  EXPECT_TRUE(json["culprit"]["op"].is_null());
  EXPECT_EQ(json["unpacked"]["shape"], nlohmann::json::array({4}));
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("--> train.py:4 in unpack"), std::string::npos) << text;
  EXPECT_NE(text.find("unpacked: the hook returned float16[4] where float32[8] was saved"),
            std::string::npos)
      << text;
}

// A hook that hands backward another dtype than was saved, and a formula that takes it: no
// error, a wrong gradient.
TEST(UnpackHookTest, AnotherDtypeBackwardAcceptedIsSilent) {
  Report report = Analyze(HookedSigmoid(5, "<lambda>", {0, kInt32, {8}, kFloat32, {8}}, nullptr));
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.evidence, SilentEvidence::kUnpackHook);
  EXPECT_FALSE(v.pytorch_raised);
  ASSERT_TRUE(v.culprit);
  EXPECT_TRUE(v.culprit->hook);
  EXPECT_EQ(Line(v.culprit), 5u);
  EXPECT_EQ(Line(v.victim), 10u);
  ASSERT_TRUE(v.unpacked);
  EXPECT_EQ(v.unpacked->dtype, "int32");
  EXPECT_EQ(v.unpacked->saved_dtype, "float32");
  EXPECT_EQ(ToJson(report)["violations"][0]["evidence"], "unpack_hook");
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("error: a saved_tensors_hooks unpack hook handed backward another tensor"),
            std::string::npos)
      << text;
}

// Non-reentrant checkpointing saves through hooks too: its recomputation errors are its own.
TEST(UnpackHookTest, CheckpointingsOwnErrorsStayUnexplained) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x},
                     {{"result", kOutput, /*has_hooks=*/true}}, b.At(10));
  b.Backward({y.node}, y.node);
  b.PythonError(
      "torch.utils.checkpoint: Recomputed values for the following tensors have different "
      "metadata than during the forward pass.");
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  EXPECT_EQ(report.unexplained_errors.size(), 1u);
}

// A node with no hooked saved tensor that throws for a reason of its own stays unexplained.
TEST(UnpackHookTest, WithoutHooksTheErrorStaysUnexplained) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
  b.Backward({y.node}, y.node);
  b.PythonError(kSizeMessage);
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty());
  EXPECT_EQ(report.unexplained_errors.size(), 1u);
}

// y = x.sigmoid(); with _unsafe_preserve_version_counter(y): y.mul_(2); y.sum().backward()
TEST(CounterResetTest, AWriteHiddenByAResetIsSilent) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
  auto mul = b.Inplace("aten::mul_", y.out, {}, b.At(12), false);
  b.SetVersion(y.out, 0);
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.evidence, SilentEvidence::kCounterReset);
  EXPECT_EQ(v.saved_version, 0u);
  EXPECT_EQ(v.current_version, 0u);
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->id, mul);
  EXPECT_FALSE(v.pytorch_raised);
  ASSERT_TRUE(v.counter_reset);
  EXPECT_EQ(v.counter_reset->from, 1u);
  EXPECT_EQ(v.counter_reset->to, 0u);
  EXPECT_EQ(v.counter_reset->before.id, mul);
  EXPECT_EQ(v.counter_reset->after.id, loss.op);
  nlohmann::json j = ToJson(report)["violations"][0];
  EXPECT_EQ(j["evidence"], "counter_reset");
  EXPECT_EQ(j["counter_reset"]["from"], 1);
  EXPECT_EQ(j["counter_reset"]["after"]["op"], "aten::sum");
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("aten::mul_ wrote into it, and its version counter was then set back to 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("its version counter went back from 1 to 0 between aten::mul_ at "
                      "train.py:12 in forward and aten::sum at train.py:13 in forward"),
            std::string::npos);
  EXPECT_NE(text.find("saved at version 0, used at version 0"), std::string::npos);
}

// A reset that a later write undoes again leaves the counter past the saved version: PyTorch
// raises, with the versions the program saw.
TEST(CounterResetTest, AWriteAfterTheResetStillRaises) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
  b.Inplace("aten::mul_", y.out, {}, b.At(12), false);
  b.Inplace("aten::mul_", y.out, {}, b.At(13), false);
  b.SetVersion(y.out, 1);
  auto add = b.Inplace("aten::add_", y.out, {}, b.At(14), false);
  b.Backward({y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kVersion);
  EXPECT_EQ(v.current_version, 2u);
  ASSERT_EQ(v.later_culprits.size(), 2u);
  EXPECT_EQ(v.later_culprits[1].id, add);
}

// An op on another thread that started before the write ended saw the older version: a race
// between threads, not a reset.
TEST(CounterResetTest, AnOpThatStartedBeforeTheWriteEndedIsNoReset) {
  TraceBuilder b;
  auto x = b.Leaf({8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
  int64_t before_write = b.Now();
  b.Inplace("aten::mul_", y.out, {}, b.At(12), false);
  b.Op({.name = "aten::clone", .inputs = {y.out}, .outputs = {b.Tensor({8})},
        .started_at = {{y.out, 0}}, .stack = b.At(20), .thread = 2, .start_ns = before_write});
  b.Backward({y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  EXPECT_EQ(report.violations[0].kind, ViolationKind::kVersion);
  EXPECT_EQ(report.violations[0].current_version, 1u);
}

// What an optimizer step writes between forward and the refill, if anything.
enum class StepWrites {
  kNothing,
  kShard,      // The shard the refill reads, which then brings other values.
  kParameter,  // Another parameter, in a trace that does not tie wrappers to their shards (an
               // optimizer step on a DTensor writes the DTensor, not the shard inside it).
  kDTensor,    // The DTensor over the shard, in a trace that ties them (format 1.9).
  kPlainParameterInATiedTrace,  // A plain parameter the refill does not read (another model's).
};

// FSDP2's unshard before forward and again before backward, in small: the sharded parameter is
// copied into the unsharded one under a preserved counter, forward saves the unsharded one, and
// backward's refill copies it in again, with `between` written in between.
struct RefillProgram {
  TraceBuilder b;
  ObjectId shard = 0, unsharded = 0, refill = 0, step = 0;
  Forwarded y, loss;

  explicit RefillProgram(StepWrites between) {
    shard = b.Leaf({8});
    unsharded = b.Tensor({8});
    auto x = b.Leaf({8});
    const bool tied = between == StepWrites::kDTensor ||
                      between == StepWrites::kPlainParameterInATiedTrace;
    auto parameter = b.Leaf({8});
    auto dtensor = tied ? b.Wrapper(shard) : 0;
    Unshard();
    y = b.Forward("aten::mul", "MulBackward0", {x, unsharded}, {{"other", unsharded}}, b.At(10));
    loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(11), {});
    const ObjectId written = between == StepWrites::kShard     ? shard
                             : between == StepWrites::kDTensor ? dtensor
                             : between == StepWrites::kNothing ? 0
                                                               : parameter;
    if (written != 0) step = b.Inplace("aten::add_", written, {}, b.At(12), false);
    refill = Unshard();
    b.Backward({loss.node, y.node});
  }

  // all-gather's copy out, then the next op on the parameter (where the reset shows).
  ObjectId Unshard() {
    ObjectId copy = b.Inplace("aten::copy_", unsharded, {shard}, b.At(5, "fsdp.py"), false);
    b.SetVersion(unsharded, 0);
    b.Op({.name = "aten::view", .inputs = {unsharded}, .outputs = {b.Alias(unsharded)},
          .stack = b.At(6, "fsdp.py")});
    return copy;
  }
};

TEST(CounterResetTest, ARefillWithTheSavedValuesIsNoViolation) {
  RefillProgram program(StepWrites::kNothing);
  Report report = Analyze(program.b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  EXPECT_EQ(report.restored_count, 1u);
  ASSERT_EQ(report.restored.size(), 1u);
  EXPECT_EQ(report.restored[0].writer.id, program.refill);
  EXPECT_EQ(report.restored[0].backward_node.name, "MulBackward0");
  EXPECT_EQ(report.restored[0].tensor.saved_name, "other");
  nlohmann::json j = ToJson(report)["restored_writes"];
  EXPECT_EQ(j["count"], 1);
  EXPECT_EQ(j["listed"][0]["writer"]["op"], "aten::copy_");
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("no saved tensor was modified"), std::string::npos) << text;
  EXPECT_NE(text.find("1 write under a preserved version counter put back the saved values"),
            std::string::npos)
      << text;
}

TEST(CounterResetTest, ARefillFromAShardWrittenSinceTheSaveIsSilent) {
  RefillProgram program(StepWrites::kShard);
  Report report = Analyze(program.b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  EXPECT_EQ(v.kind, ViolationKind::kSilent);
  EXPECT_EQ(v.evidence, SilentEvidence::kCounterReset);
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->id, program.refill);
  EXPECT_EQ(report.restored_count, 0u);
}

// The refill's lineage is the save's, but a parameter was written in between: the lineage cannot
// tell whether that parameter is the shard's wrapper (the trace does not tie them), or it is a
// DTensor over the shard, so the write stays a violation, and the parameter's write is where its
// values changed.
class RefillAcrossAParameterWrite : public ::testing::TestWithParam<StepWrites> {};

INSTANTIATE_TEST_SUITE_P(CounterResetTest, RefillAcrossAParameterWrite,
                         ::testing::Values(StepWrites::kParameter, StepWrites::kDTensor));

TEST_P(RefillAcrossAParameterWrite, NamesThatWrite) {
  RefillProgram program(GetParam());
  Report report = Analyze(program.b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  const Violation& v = report.violations[0];
  ASSERT_TRUE(v.culprit);
  EXPECT_EQ(v.culprit->id, program.refill);
  ASSERT_TRUE(v.changed_source);
  EXPECT_EQ(v.changed_source->id, program.step);
  EXPECT_EQ(report.restored_count, 0u);
  EXPECT_EQ(ToJson(report)["violations"][0]["changed_source"]["op"], "aten::add_");
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("the values it wrote back come from a parameter written after the save, by "
                      "aten::add_ at train.py:12"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("help: update the parameter after backward()"), std::string::npos) << text;
}

// In a trace that ties DTensors to their shards, a plain parameter the refill does not read (an EMA
// of another model's weights, a clamp of an unrelated one) leaves the restoration trusted.
TEST(CounterResetTest, ARefillAcrossAnUnrelatedPlainParameterWriteIsNoViolation) {
  RefillProgram program(StepWrites::kPlainParameterInATiedTrace);
  Report report = Analyze(program.b.records);
  EXPECT_TRUE(report.violations.empty()) << FormatText(report, false);
  EXPECT_EQ(report.restored_count, 1u);
}

// A copy from another tensor than the one the save's bytes came from is a write, however the
// counter was kept.
TEST(CounterResetTest, ARefillFromAnotherSourceIsSilent) {
  TraceBuilder b;
  auto shard = b.Leaf({8});
  auto other = b.Leaf({8});
  auto unsharded = b.Tensor({8});
  auto x = b.Leaf({8});
  b.Inplace("aten::copy_", unsharded, {shard}, b.At(5), false);
  b.SetVersion(unsharded, 0);
  auto y = b.Forward("aten::mul", "MulBackward0", {x, unsharded}, {{"other", unsharded}}, b.At(10));
  ObjectId refill = b.Inplace("aten::copy_", unsharded, {other}, b.At(12), false);
  b.SetVersion(unsharded, 0);
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out, unsharded}, {}, b.At(13), {});
  b.Backward({loss.node, y.node});
  Report report = Analyze(b.records);
  ASSERT_EQ(report.violations.size(), 1u) << FormatText(report, false);
  EXPECT_EQ(report.violations[0].evidence, SilentEvidence::kCounterReset);
  ASSERT_TRUE(report.violations[0].culprit);
  EXPECT_EQ(report.violations[0].culprit->id, refill);
}

// Two threads, each running backward over a graph of its own while the other does forward work:
// one pass each, however their records interleave.
TEST(PassRuleTest, ConcurrentPassesOnTwoThreadsStayApart) {
  TraceBuilder b;
  auto x1 = b.Leaf({8});
  auto x2 = b.Leaf({8});
  auto y1 = b.Forward("aten::sigmoid", "SigmoidBackward0", {x1}, {{"result", kOutput}}, b.At(10));
  auto l1 = b.Forward("aten::sum", "SumBackward0", {y1.out}, {}, b.At(11), {});
  b.forward_thread = 2;
  auto y2 = b.Forward("aten::sigmoid", "SigmoidBackward0", {x2}, {{"result", kOutput}}, b.At(10));
  auto l2 = b.Forward("aten::sum", "SumBackward0", {y2.out}, {}, b.At(11), {});
  auto forward_on = [&b](uint32_t thread) {
    b.Op({.name = "aten::randn", .outputs = {b.Tensor({8})}, .stack = b.At(9), .thread = thread});
  };
  b.Backward({l1.node}, 0, "", 1);
  forward_on(2);
  b.Backward({y1.node}, 0, "", 1);
  b.Backward({l2.node}, 0, "", 2);
  b.Backward({b.AccumulateGradOf(x1)}, 0, "", 1);
  forward_on(1);
  b.Backward({y2.node, b.AccumulateGradOf(x2)}, 0, "", 2);
  Report report = Analyze(b.records);
  EXPECT_EQ(report.backward_passes, 2u);
  EXPECT_EQ(report.node_executions, 6u);
  EXPECT_TRUE(report.violations.empty());
}

// Nodes run on a device's worker thread (3) while the thread that built the graph (1) does the
// forward work between steps: one pass per step.
TEST(PassRuleTest, ForwardWorkOfTheThreadThatBuiltTheGraphEndsItsPass) {
  TraceBuilder b;
  for (int step = 0; step < 3; ++step) {
    auto x = b.Leaf({8});
    auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(10));
    b.Backward({y.node, b.AccumulateGradOf(x)}, 0, "", 3);
  }
  EXPECT_EQ(Analyze(b.records).backward_passes, 3u);
}

// The program ends with an error the forward raised, not about saved tensors (an in-place op on a
// leaf that requires grad): the report names it, with the op that raised it, instead of reading
// as a clean run, and the JSON carries it.
TEST(ProgramErrorTest, AnErrorTheForwardRaisedIsReportedWithItsOp) {
  TraceBuilder b;
  auto x = b.Leaf({4});
  b.Op({.name = "aten::add_", .inputs = {x}, .stack = b.At(12), .threw = true});
  b.PythonError("a leaf Variable that requires grad is being used in an in-place operation.");
  Report report = Analyze(b.records);
  EXPECT_TRUE(report.violations.empty());
  ASSERT_TRUE(report.program_error);
  EXPECT_EQ(report.program_error->type, "RuntimeError");
  EXPECT_EQ(report.program_error->op.name, "aten::add_");
  ASSERT_TRUE(report.program_error->op.user_frame);
  EXPECT_EQ(report.program_error->op.user_frame->line, 12u);
  std::string text = FormatText(report, false);
  EXPECT_NE(text.find("the program raised an error that torchrr does not explain"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("RuntimeError: a leaf Variable"), std::string::npos) << text;
  EXPECT_EQ(text.find("no saved tensor was modified ("), std::string::npos) << text;
  nlohmann::json j = ToJson(report);
  EXPECT_EQ(j["program_error"]["type"], "RuntimeError");
  EXPECT_EQ(j["program_error"]["op"]["op"], "aten::add_");
}

// torch.compile's errors run over several lines: each is a fact line of its own, escaped, so that
// the message reads as written and no line of it can pass for a diagnostic.
TEST(ProgramErrorTest, AMessageOfSeveralLinesKeepsItsLines) {
  TraceBuilder b;
  auto x = b.Leaf({4});
  b.Op({.name = "aten::add_", .inputs = {x}, .stack = b.At(12), .threw = true});
  b.PythonError("Unsupported: call to a skipped function\n  Explanation: it is skipped\n\n"
                "error: forged\x1b[31m");
  const std::string text = FormatText(Analyze(b.records), false);
  EXPECT_NE(text.find("   = RuntimeError: Unsupported: call to a skipped function\n"
                      "   =     Explanation: it is skipped\n"
                      "   =   error: forged"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("\\n"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
}

// An op that threw earlier, with others after it, did not raise the program's error; an
// interrupted run is no error; a version-check error after another one is the program's last.
TEST(ProgramErrorTest, OnlyTheLastErrorAndOnlyTheOpJustBeforeIt) {
  {
    TraceBuilder b;
    auto x = b.Leaf({4});
    b.Op({.name = "aten::add_", .inputs = {x}, .stack = b.At(12), .threw = true});
    b.Op({.name = "aten::mul", .inputs = {x}, .stack = b.At(13)});
    b.PythonError("bad batch");
    Report report = Analyze(b.records);
    ASSERT_TRUE(report.program_error);
    EXPECT_EQ(report.program_error->op.id, 0u);
    EXPECT_NE(FormatText(report, false).find("<no recorded op raised it>"), std::string::npos);
    EXPECT_TRUE(ToJson(report)["program_error"]["op"].is_null());
  }
  {
    TraceBuilder b;
    b.Leaf({4});
    format::ErrorRecord interrupt;
    interrupt.kind = format::ErrorKind::kPythonException;
    interrupt.type = b.Str("KeyboardInterrupt");
    b.records.push_back(interrupt);
    Report report = Analyze(b.records);
    EXPECT_FALSE(report.program_error);
    EXPECT_TRUE(ToJson(report)["program_error"].is_null());
  }
  {
    TraceBuilder b;
    b.Leaf({4});
    b.PythonError("bad batch");
    b.PythonError("one of the variables needed for gradient computation has been modified by an "
                  "inplace operation");
    EXPECT_FALSE(Analyze(b.records).program_error);
  }
}

}  // namespace
}  // namespace torchrr::replayer
