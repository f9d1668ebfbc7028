// StepWindow (recorder/src/sink/step_window.h): where steps begin, which are kept, and what a window
// carries from before it, read back through the trace format.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "sink/step_window.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"

namespace torchrr::recorder {
namespace {

using format::ObjectId;

// One training step as the writer thread sees it: a forward op that uses the parameter (tensor 1,
// defined in step 0 only) and creates a node, its backward, then the optimizer's op.
class Training {
 public:
  // `added`: called after each record the run gives the window.
  explicit Training(StepWindow& window,
                    std::function<void(const format::Record&)> added = nullptr)
      : window_(window), added_(std::move(added)) {}

  void Add(const format::Record& record) {
    window_.Add(record);
    if (added_) added_(record);
  }

  void Step(bool with_definitions) {
    if (with_definitions) {
      Add(format::StringDef{1, "aten::mul"});
      format::TensorInfo param;
      param.tensor = 1;
      param.requires_grad = true;
      Add(param);
    }
    const ObjectId out = NewId(), node = NewId(), op = NewId();
    format::TensorInfo activation;
    activation.tensor = out;
    activation.is_leaf = false;
    activation.grad_fn = node;
    Add(activation);
    format::NodeRecord created;
    created.node = node;
    created.created_by = op;
    Add(created);
    Add(Op(op, format::OpScope::kFunction, true, {1}));
    Add(Op(NewId(), format::OpScope::kBackwardFunction, false, {}));
    Add(Op(NewId(), format::OpScope::kFunction, false, {1}));  // The optimizer.
  }

  format::OpRecord Op(ObjectId id, format::OpScope scope, bool grad_mode,
                      std::vector<ObjectId> inputs) {
    format::OpRecord r;
    r.op = id;
    r.name = 1;
    r.scope = scope;
    r.grad_mode = grad_mode;
    r.start_ns = r.end_ns = ++time_;
    for (ObjectId t : inputs) r.inputs.push_back(format::TensorUse{t, 0, 0, 0, 0});
    return r;
  }
  ObjectId NewId() { return ++next_id_; }

 private:
  StepWindow& window_;
  std::function<void(const format::Record&)> added_;
  ObjectId next_id_ = 100;
  int64_t time_ = 1000;
};

std::vector<format::Record> Written(StepWindow& window) {
  std::string bytes;
  auto writer = format::TraceWriter::ToString(&bytes, format::FileInfo{});
  EXPECT_TRUE(window.WriteTo(*writer).ok());
  EXPECT_TRUE(writer->Close().ok());
  format::Trace trace = format::ReadTraceBytesAll(bytes);
  EXPECT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  return trace.records;
}

template <class T>
std::vector<T> All(const std::vector<format::Record>& records) {
  std::vector<T> out;
  for (const format::Record& r : records) {
    if (const T* t = std::get_if<T>(&r)) out.push_back(*t);
  }
  return out;
}

TEST(StepWindow, KeepsTheLastStepsAndWhatTheyNameFromBefore) {
  StepWindow window(2, size_t{1} << 30);
  Training run(window);
  for (int i = 0; i < 6; ++i) run.Step(i == 0);
  EXPECT_EQ(window.steps_seen(), 6u);
  const std::vector<format::Record> records = Written(window);
  const auto steps = All<format::StepRecord>(records);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 4u);
  EXPECT_EQ(steps[1].step, 5u);
  EXPECT_FALSE(steps[0].marked);
  // Two steps' ops (three each), the parameter's metadata from step 0, the string it names.
  EXPECT_EQ(All<format::OpRecord>(records).size(), 6u);
  const auto tensors = All<format::TensorInfo>(records);
  ASSERT_FALSE(tensors.empty());
  EXPECT_EQ(tensors[0].tensor, 1u);
  ASSERT_EQ(All<format::StringDef>(records).size(), 1u);
  // Every step begins with its forward: the window's first op after its first StepRecord is one.
  bool after_mark = false;
  for (const format::Record& r : records) {
    if (std::holds_alternative<format::StepRecord>(r)) after_mark = true;
    if (const auto* op = std::get_if<format::OpRecord>(&r); op && after_mark) {
      EXPECT_TRUE(op->grad_mode);
      break;
    }
  }
}

TEST(StepWindow, AnOpThatMakesNoNodeSplitsNothing) {
  StepWindow window(10, size_t{1} << 30);
  Training run(window);
  run.Step(true);
  // After the backward: item() and an evaluation pass under no_grad, no node made.
  window.Add(run.Op(run.NewId(), format::OpScope::kFunction, true, {1}));
  window.Add(run.Op(run.NewId(), format::OpScope::kFunction, false, {1}));
  run.Step(false);
  EXPECT_EQ(window.steps_seen(), 2u);
}

TEST(StepWindow, TheProgramsMarksAreTheBoundaries) {
  StepWindow window(3, size_t{1} << 30);
  Training run(window);
  run.Step(true);  // Before the first mark: no step of its own.
  for (int i = 0; i < 5; ++i) {
    window.Add(format::StepRecord{0, 10 + i, true});
    run.Step(false);
    run.Step(false);  // Two backward passes per marked step (gradient accumulation).
  }
  const auto steps = All<format::StepRecord>(Written(window));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].step, 2u);
  EXPECT_TRUE(steps[0].marked);
  EXPECT_EQ(steps[2].time_ns, 14);
}

TEST(StepWindow, ForgetsWhatNoStepNamedForLong) {
  StepWindow window(1, size_t{1} << 30);
  Training run(window);
  format::TensorInfo once;
  once.tensor = 7;  // Named by step 0 only.
  window.Add(once);
  for (int i = 0; i < 3 + 2 * int(StepWindow::kForgetAfterSteps); ++i) run.Step(i == 0);
  window.Add(run.Op(run.NewId(), format::OpScope::kFunction, true, {7}));
  for (const auto& tensor : All<format::TensorInfo>(Written(window))) {
    EXPECT_NE(tensor.tensor, 7u);
  }
}

TEST(StepWindow, AStepWithNoEndIsCutToStayBounded) {
  StepWindow window(2, 4096);
  Training run(window);
  for (int i = 0; i < 2000; ++i) {
    window.Add(run.Op(run.NewId(), format::OpScope::kFunction, false, {1}));
  }
  EXPECT_GT(window.steps_seen(), 2u);
  EXPECT_EQ(window.steps_kept(), 2u);
}

TEST(StepWindow, KeepsARangeAndIsDoneAfterIt) {
  StepWindow window(0, size_t{1} << 30);
  window.KeepRange(3, 4);
  Training run(window);
  for (int i = 0; i < 5; ++i) run.Step(i == 0);
  EXPECT_FALSE(window.done());
  run.Step(false);  // Step 5 begins: the range is over.
  EXPECT_TRUE(window.done());
  const std::vector<format::Record> records = Written(window);
  const auto steps = All<format::StepRecord>(records);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 3u);
  EXPECT_EQ(steps[1].step, 4u);
  EXPECT_EQ(All<format::OpRecord>(records).size(), 6u);
}

// --spill: a window written when it changes, then followed record by record, holds at every
// moment what the window written whole would: the same records, and a tensor from before the
// window ahead of the first record that names it after the window was written.
TEST(StepWindow, AWindowFollowedOnDiskIsTheWindow) {
  StepWindow window(2, size_t{1} << 30);
  std::string bytes;
  std::unique_ptr<format::TraceWriter> spill;
  std::set<ObjectId> carried;
  uint64_t written_at = 0;
  int rotations = 0;
  Training run(window, [&](const format::Record& record) {
    if (!spill || window.changes() != written_at) {
      spill.reset();  // It writes its index into `bytes` as it closes.
      bytes.clear();
      spill = format::TraceWriter::ToString(&bytes, format::FileInfo{});
      carried.clear();
      ASSERT_TRUE(window.WriteTo(*spill, &carried).ok());
      written_at = window.changes();
      ++rotations;
      return;
    }
    ASSERT_TRUE(window.AppendFollowing(record, *spill, &carried).ok());
  });
  format::TensorInfo late;
  late.tensor = 7;  // Made in step 0, named again only at the end of the last step.
  run.Add(late);
  for (int i = 0; i < 6; ++i) run.Step(i == 0);
  run.Add(run.Op(run.NewId(), format::OpScope::kFunction, false, {7}));
  EXPECT_EQ(rotations, 6);
  ASSERT_TRUE(spill->Close().ok());
  format::Trace followed = format::ReadTraceBytesAll(bytes);
  ASSERT_TRUE(followed.summary.status.ok()) << followed.summary.status.message();

  // The same records, in another order.
  std::vector<format::Record> unmatched = followed.records;
  for (const format::Record& record : Written(window)) {
    auto it = std::find(unmatched.begin(), unmatched.end(), record);
    ASSERT_NE(it, unmatched.end()) << "record " << record.index() << " not followed";
    unmatched.erase(it);
  }
  EXPECT_TRUE(unmatched.empty()) << unmatched.size() << " records more than the window";

  // The late tensor's record comes before the op that names it.
  auto position = [&](auto matches) {
    return std::find_if(followed.records.begin(), followed.records.end(), matches) -
           followed.records.begin();
  };
  const auto info = position([](const format::Record& r) {
    const auto* t = std::get_if<format::TensorInfo>(&r);
    return t && t->tensor == 7;
  });
  const auto use = position([](const format::Record& r) {
    const auto* op = std::get_if<format::OpRecord>(&r);
    return op && !op->inputs.empty() && op->inputs[0].tensor == 7;
  });
  ASSERT_LT(use, static_cast<long>(followed.records.size()));
  EXPECT_LT(info, use);
}

}  // namespace
}  // namespace torchrr::recorder
