// torchrr repro's script (replayer/include/torchrr/replayer/repro.h) for hand-built traces: which
// ops the slice keeps, how they are called, what is made up, and what is refused.
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "torchrr/replayer/repro.h"
#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using testing::kOutput;
using testing::TraceBuilder;

// Gives the recorded op `op` a non-tensor argument (TraceBuilder records none).
void AddValue(TraceBuilder& b, format::ObjectId op, format::Value value) {
  for (format::Record& r : b.records) {
    if (auto* record = std::get_if<format::OpRecord>(&r); record != nullptr && record->op == op) {
      record->values.push_back(value);
    }
  }
}

Repro ReproOf(const TraceBuilder& b) {
  Report report = Analyze(b.records);
  format::FileInfo info;
  info.torch_version = "2.15.0";
  ReproOptions options;
  options.trace_name = "run.trr";
  return WriteRepro(b.records, report, info, options);
}

// x = leaf; h = x.exp(); x.tanh() (unrelated); y = h.sigmoid(); y.mul_(2); backward. The
// sigmoid saved its result: h, made by exp, is not the saved tensor and becomes a leaf.
TEST(ReproTest, KeepsTheVictimAndTheCulpritAndMakesUpTheOtherOperands) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto h = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(10));
  auto other = b.Forward("aten::tanh", "TanhBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {h.out}, {{"result", kOutput}}, b.At(12));
  auto mul = b.InplaceForward("aten::mul_", "MulBackward1", y.out, {}, b.At(13));
  AddValue(b, mul.op, {.position = 1, .kind = format::ValueKind::kDouble, .d = 2});
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(14), {});
  b.Backward({loss.node, mul.node, y.node}, y.node);
  (void)other;

  Repro repro = ReproOf(b);
  ASSERT_TRUE(repro.ok) << repro.error;
  EXPECT_EQ(repro.slice_ops, 2u);  // sigmoid, mul_.
  EXPECT_EQ(repro.trace_ops, 8u);  // Five forward ops and three backward functions.
  const std::string& s = repro.script;
  EXPECT_TRUE(s.starts_with(kReproPrefix)) << s;
  EXPECT_NE(s.find("Recorded with torch 2.15.0"), std::string::npos);
  EXPECT_NE(s.find("t" + std::to_string(h.out) + " = leaf(gen, [4, 8], torch.float32, 'cpu', "
                   "requires_grad=True)"), std::string::npos) << s;
  EXPECT_NE(s.find("t" + std::to_string(y.out) + " = call(aten.sigmoid.default, t" +
                   std::to_string(h.out) + ")[0]"), std::string::npos) << s;
  EXPECT_EQ(s.find("aten.exp"), std::string::npos) << s;
  EXPECT_NE(s.find("t" + std::to_string(y.out) + " = call(aten.mul_.default, t" +
                   std::to_string(y.out) + ", 2.0)[0]"), std::string::npos) << s;
  EXPECT_EQ(s.find("aten.tanh"), std::string::npos) << s;
  EXPECT_NE(s.find("# train.py:12 in forward -- the victim: SigmoidBackward0 saves result"),
            std::string::npos) << s;
  EXPECT_NE(s.find("torch.autograd.backward([t" + std::to_string(y.out) + ".sum()])"),
            std::string::npos);
  EXPECT_NE(s.find("backward did not raise: not reproduced"), std::string::npos);
}

// w = leaf; y = x @ w; w.data.mul_(2): the write goes through a tensor with its own counter.
TEST(ReproTest, SilentDataWriteComparesTheGradientsWithTheWriteOnACopy) {
  TraceBuilder b;
  auto x = b.Leaf({4, 3});
  auto w = b.Leaf({3, 3});
  auto y = b.Forward("aten::mm", "MmBackward0", {x, w}, {{"self", x}, {"mat2", w}}, b.At(5),
                     {4, 3});
  auto data = b.Data(w);
  auto write = b.Inplace("aten::mul_", data, {}, b.At(6));
  AddValue(b, write, {.position = 1, .kind = format::ValueKind::kInt, .i = 2});
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(7), {});
  b.Backward({loss.node, y.node});

  Repro repro = ReproOf(b);
  ASSERT_TRUE(repro.ok) << repro.error;
  const std::string& s = repro.script;
  const std::string var = "t" + std::to_string(data);
  EXPECT_NE(s.find(var + " = t" + std::to_string(w) + ".data\n"), std::string::npos) << s;
  EXPECT_NE(s.find("if not recorded_write:"), std::string::npos) << s;
  EXPECT_NE(s.find(var + " = " + var + ".clone()"), std::string::npos) << s;
  EXPECT_NE(s.find("the gradients differ"), std::string::npos);
}

// x = leaf; y = op(x), saving its result; y.mul_(2); backward raises. Returns the mul_'s op.
format::ObjectId SavesThenWrites(TraceBuilder& b, const std::string& op, const std::string& node,
                                 const std::string& write = "aten::mul_") {
  auto x = b.Leaf({4, 8});
  auto y = b.Forward(op, node, {x}, {{"result", kOutput}}, b.At(11));
  auto mul = b.InplaceForward(write, "MulBackward1", y.out, {}, b.At(12));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, mul.node, y.node}, y.node);
  return mul.op;
}

// The reproducer of SavesThenWrites(op) whose mul_ has its argument.
Repro ReproOfSaveBy(const std::string& op) {
  TraceBuilder b;
  auto mul = SavesThenWrites(b, op, "SigmoidBackward0");
  AddValue(b, mul, {.position = 1, .kind = format::ValueKind::kDouble, .d = 2});
  return ReproOf(b);
}

// The reproducer of SavesThenWrites(aten::sigmoid) whose write is `op`, with its argument.
Repro ReproOfWriteBy(const std::string& op) {
  TraceBuilder b;
  auto write = SavesThenWrites(b, "aten::sigmoid", "SigmoidBackward0", op);
  AddValue(b, write, {.position = 1, .kind = format::ValueKind::kDouble, .d = 2});
  return ReproOf(b);
}

// Every line of `script` that holds `text` (a hostile name from the trace) is a comment.
void ExpectOnlyInComments(const std::string& script, const std::string& text) {
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(text) == std::string::npos) continue;
    EXPECT_EQ(line.substr(line.find_first_not_of(' '), 2), "# ") << line;
  }
}

// The ids of a custom Function's trace (FunctionCall).
struct FunctionIds {
  format::ObjectId h = 0, y = 0;
};

// h = x.exp(); y = Fn.apply(x or h), its node (`name`Backward) custom, saving what `saved` picks
// (given b, x, h); h.add_(1); backward raises. The Function's op has no recorded outputs, as an
// autograd.Function's apply, which is not a dispatcher op, has none.
template <typename Pick>
FunctionIds FunctionCall(TraceBuilder& b, const std::string& name, bool takes_h, Pick saved) {
  auto x = b.Leaf({4, 8});
  auto h = b.Forward("aten::exp", "ExpBackward0", {x}, {{"result", kOutput}}, b.At(10));
  const format::ObjectId keep = saved(b, x, h.out);
  auto y = b.Forward(name, name + "Backward", {takes_h ? h.out : x}, {{"saved_tensors", keep}},
                     b.At(11));
  for (format::Record& r : b.records) {
    if (auto* op = std::get_if<format::OpRecord>(&r); op != nullptr && op->op == y.op) {
      op->outputs.clear();
    }
    if (auto* n = std::get_if<format::NodeRecord>(&r); n != nullptr && n->node == y.node) {
      n->saved_kind = format::SavedSetKind::kCustom;
    }
  }
  auto add = b.InplaceForward("aten::add_", "AddBackward0", h.out, {}, b.At(12));
  AddValue(b, add.op, {.position = 1, .kind = format::ValueKind::kInt, .i = 1});
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, y.node}, y.node);
  return {h.out, y.out};
}

// Fn saves its input h: its op is a stand-in of the node's class name that saves its input; a
// name that is no identifier (the script is run, the trace is anyone's) makes the class StandIn.
TEST(ReproTest, CallsAnAutogradFunctionThroughAStandInThatKeepsItsSave) {
  for (const std::string name : {"Square", "__import__('os').system('x')#"}) {
    TraceBuilder b;
    const FunctionIds ids = FunctionCall(
        b, name, true, [](TraceBuilder&, format::ObjectId, format::ObjectId h) { return h; });
    Repro repro = ReproOf(b);
    ASSERT_TRUE(repro.ok) << repro.error;
    EXPECT_EQ(repro.slice_ops, 3u);  // exp (it made the saved tensor), the Function, add_.
    EXPECT_EQ(repro.stand_ins, 1u);
    const std::string& s = repro.script;
    const std::string cls = name == "Square" ? "Square" : "StandIn";
    EXPECT_NE(s.find("class " + cls + "(torch.autograd.Function):"), std::string::npos) << s;
    EXPECT_NE(s.find("t" + std::to_string(ids.y) + ", = " + cls + ".apply(t" +
                     std::to_string(ids.h) + ")"), std::string::npos) << s;
    EXPECT_NE(s.find("outputs = [output(1, [4, 8], torch.float32, 'cpu')]"), std::string::npos)
        << s;
    EXPECT_NE(s.find("ctx.save_for_backward(inputs[0])"), std::string::npos) << s;
    EXPECT_NE(s.find("def standin_backward(ctx, *grads):"), std::string::npos) << s;
    ExpectOnlyInComments(s, "__import__");
  }
}

// Fn, called on x, saved a tensor with h's counter over bytes of its own: none of its inputs and
// outputs, nor over their bytes. The violation's save cannot be kept, and the script is refused
// rather than not reproduce.
TEST(ReproTest, RefusesAStandInWhoseSaveIsNoneOfItsTensors) {
  TraceBuilder b;
  FunctionCall(b, "Fn", false, [](TraceBuilder& b, format::ObjectId, format::ObjectId h) {
    auto inner = b.View(h, {8, 4}, {1, 8}, 0);
    b.Info(inner).storage = b.NewId();
    b.records.push_back(b.Info(inner));
    return inner;
  });
  Repro repro = ReproOf(b);
  EXPECT_FALSE(repro.ok);
  EXPECT_NE(repro.error.find("FnBackward saved is not one of its op's inputs or outputs"),
            std::string::npos) << repro.error;
}

// An op outside aten made the save: a stand-in, which saves nothing, would not reproduce it.
TEST(ReproTest, RefusesAVictimOutsideAten) {
  Repro repro = ReproOfSaveBy("mylib::fused");
  EXPECT_FALSE(repro.ok);
  EXPECT_NE(repro.error.find("mylib::fused is not an ATen op"), std::string::npos) << repro.error;
}

// The write is an op outside aten (a torch.library or C++ extension op), whose code the script
// does not have: a stand-in writes the saved tensor once per version bump recorded, with a
// comment that says so, and no call of the op.
TEST(ReproTest, WritesThroughAStandInForAnOpOutsideAten) {
  for (const std::string name : {"mylib::scale_", "mylib::scale_2"}) {
    Repro repro = ReproOfWriteBy(name);
    ASSERT_TRUE(repro.ok) << repro.error;
    EXPECT_EQ(repro.stand_ins, 1u);
    const std::string& s = repro.script;
    EXPECT_NE(s.find("# A stand-in for mylib::"), std::string::npos) << s;
    EXPECT_NE(s.find("def standin_write(t, bumps):"), std::string::npos) << s;
    EXPECT_EQ(s.find("call(mylib"), std::string::npos) << s;
    EXPECT_EQ(s.find("ops.mylib"), std::string::npos) << s;
    EXPECT_NE(s.find("    standin_write(t"), std::string::npos) << s;
    EXPECT_NE(s.find(", 1)\n"), std::string::npos) << s;
  }
}

// An op outside aten that wrote through the saved tensor and a view of it bumped their one
// version counter once for each, and each use records the counter's whole change (+2): the
// stand-in writes the counter's two bumps once, not once per tensor (four).
TEST(ReproTest, AStandInWritesEachVersionCounterOnce) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(11));
  auto view = b.View(y.out, {8, 4}, {1, 8}, 0);
  auto write = b.Op({.name = "mylib::scale_both_", .inputs = {y.out, view},
                     .writes = {y.out, view}, .stack = b.At(12)});
  AddValue(b, write, {.position = 2, .kind = format::ValueKind::kDouble, .d = 2});
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, y.node}, y.node);
  Repro repro = ReproOf(b);
  ASSERT_TRUE(repro.ok) << repro.error;
  const std::string& s = repro.script;
  size_t writes = 0;
  for (size_t at = s.find("    standin_write(t"); at != std::string::npos;
       at = s.find("    standin_write(t", at + 1)) {
    ++writes;
  }
  EXPECT_EQ(writes, 1u) << s;
  EXPECT_NE(s.find("standin_write(t" + std::to_string(y.out) + ", 2)\n"), std::string::npos) << s;
}

// A name of another shape than a dispatcher op's is no op a stand-in may stand for: refused, and
// the hostile name stays out of the script.
TEST(ReproTest, RefusesAWriteOfNoDispatcherOpsName) {
  for (const std::string name : {"mylib::x(__import__('os'))", "Torch-Compiled Region: 0/0"}) {
    Repro repro = ReproOfWriteBy(name);
    EXPECT_FALSE(repro.ok);
    EXPECT_NE(repro.error.find("is not an ATen op"), std::string::npos) << repro.error;
    EXPECT_EQ(repro.script, "");
  }
}

// The script is run, and a trace is anyone's: an op name that is no identifier could be code.
TEST(ReproTest, RefusesAnOpNameThatIsNoIdentifier) {
  Repro repro = ReproOfSaveBy("aten::sigmoid(__import__('os'))");
  EXPECT_FALSE(repro.ok);
  EXPECT_NE(repro.error.find("is not an ATen op"), std::string::npos) << repro.error;
  EXPECT_EQ(repro.script, "");
}

// A trace's file names end up in the script's comments: a line break or an escape in one stays
// escaped, so that no line of the script is the trace's.
TEST(ReproTest, KeepsATracesStringsInsideItsComments) {
  TraceBuilder b;
  auto x = b.Leaf({4, 8});
  const std::string file = "/tmp/\x1b]0;pwned\x07train.py\nimport os; os.system('pwned')";
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}},
                     b.At(11, file));
  auto mul = b.InplaceForward("aten::mul_", "MulBackward1", y.out, {}, b.At(12, file));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(13), {});
  b.Backward({loss.node, mul.node, y.node}, y.node);
  AddValue(b, mul.op, {.position = 1, .kind = format::ValueKind::kDouble, .d = 2});

  Repro repro = ReproOf(b);
  ASSERT_TRUE(repro.ok) << repro.error;
  EXPECT_EQ(repro.script.find("\nimport os"), std::string::npos) << repro.script;
  EXPECT_EQ(repro.script.find('\x1b'), std::string::npos);
  EXPECT_NE(repro.script.find("train.py\\nimport os"), std::string::npos) << repro.script;
}

// redact --drop-values leaves no op an argument: a script would call every op short of them.
TEST(ReproTest, RefusesATraceWhoseArgumentsWereDropped) {
  TraceBuilder b;
  SavesThenWrites(b, "aten::sigmoid", "SigmoidBackward0");

  Repro repro = ReproOf(b);
  EXPECT_FALSE(repro.ok);
  EXPECT_NE(repro.error.find("--drop-values"), std::string::npos) << repro.error;
}

TEST(ReproTest, RefusesATraceWithoutViolationsAndAnIndexPastThem) {
  TraceBuilder b;
  auto x = b.Leaf({4});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}}, b.At(1));
  auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(2), {});
  b.Backward({loss.node, y.node});
  Repro repro = ReproOf(b);
  EXPECT_FALSE(repro.ok);
  EXPECT_EQ(repro.error, "the trace holds no violation to reproduce");
}

// repro --check's verdict: the recorded message's first sentence (its type name aside),
// the kind's words when none was kept, and a silent write's gradient line.
TEST(ReproTest, JudgesARunByTheRecordedMessage) {
  Violation v;
  v.pytorch_message =
      "one of the variables needed for gradient computation has been modified by an inplace "
      "operation: [torch.cuda.FloatTensor [4]], which is output 0 of SigmoidBackward0, is at "
      "version 1; expected version 0 instead. Hint: enable anomaly detection";
  const std::string raised =
      "Traceback (most recent call last):\nRuntimeError: one of the variables needed for gradient "
      "computation has been modified by an inplace operation: [torch.FloatTensor [4]], which is "
      "output 0 of SigmoidBackward0, is at version 1; expected version 0 instead. Hint: other\n";
  EXPECT_TRUE(JudgeRepro(v, 1, raised).reproduced);
  EXPECT_FALSE(JudgeRepro(v, 0, raised).reproduced);
  std::string other_version = raised;
  other_version.replace(other_version.find("version 1"), 9, "version 2");
  const ReproCheck wrong = JudgeRepro(v, 1, other_version);
  EXPECT_FALSE(wrong.reproduced);
  EXPECT_NE(wrong.summary.find("status 1: RuntimeError: one of"), std::string::npos)
      << wrong.summary;

  // A trace recorded from C++ names the type as C++ does.
  v.pytorch_message = "one of the variables needed for gradient computation has been modified by "
                      "an inplace operation: [CPUFloatType [4]], which is output 0 of "
                      "SigmoidBackward0, is at version 1; expected version 0 instead. Hint: x";
  EXPECT_TRUE(JudgeRepro(v, 1, raised).reproduced);
  // torch.compile wraps the message it raised while tracing backward; PyTorch's words count.
  v.pytorch_message = "backend='inductor' raised:\nRuntimeError: one of the variables needed for "
                      "gradient computation has been modified by an inplace operation: "
                      "[torch.FloatTensor [4]], which is output 0 of SigmoidBackward0, is at "
                      "version 1; expected version 0 instead. Hint: x";
  EXPECT_TRUE(JudgeRepro(v, 1, raised).reproduced);
  EXPECT_FALSE(JudgeRepro(v, 1, other_version).reproduced);
  v.pytorch_message.reset();
  EXPECT_TRUE(JudgeRepro(v, 1, other_version).reproduced);
  v.kind = ViolationKind::kSilent;
  EXPECT_FALSE(JudgeRepro(v, 1, raised).reproduced);
  EXPECT_TRUE(JudgeRepro(v, 1, "torchrr repro: the gradients differ: ...\n").reproduced);
  EXPECT_FALSE(JudgeRepro(v, 2, "torchrr repro: the gradients are the same\n").reproduced);
}

}  // namespace
}  // namespace torchrr::replayer
