// The step coding's parts (format/SPEC.md "Step coding"): the step rule, recent ids, and the
// node execution and op times of 1.14 and 1.15, each coder as an encoder and a decoder.
#include <gtest/gtest.h>

#include <span>
#include <utility>
#include <vector>

#include "record_codec.h"
#include "sample_records.h"
#include "torchrr/format/step_rule.h"
#include "trace_test_helpers.h"

namespace torchrr::format {
namespace {

using testing::ExpectSameRecords;
using testing::TrainingSteps;

// The step rule of SPEC.md "Steps" on two steps of forward, backward, optimizer.
TEST(StepRule, ATopLevelOpThatMakesNodesAfterBackwardBeginsAStep) {
  auto op = [](ObjectId id, ObjectId parent, OpScope scope = OpScope::kFunction) {
    OpRecord r;
    r.op = id;
    r.parent = parent;
    r.scope = scope;
    return r;
  };
  StepRule rule;
  // Step 0: a forward op (with a nested one) that makes a node, a no_grad op, backward.
  EXPECT_FALSE(rule.Add(NodeRecord{}));
  EXPECT_FALSE(rule.Add(op(2, 1)));
  EXPECT_FALSE(rule.Add(op(1, 0)));
  EXPECT_FALSE(rule.Add(op(3, 0)));
  EXPECT_FALSE(rule.Add(op(4, 0, OpScope::kBackwardFunction)));
  // The optimizer makes no node: still step 0.
  EXPECT_FALSE(rule.Add(op(5, 0)));
  // The engine's wrapper is no step's first op, and leaves the count of nodes as it is.
  EXPECT_FALSE(rule.OnOp(op(6, 0), /*engine_wrapper=*/true));
  // A frozen lookup (no node) stays in step 0; the first op that makes a node begins step 1,
  // its records and those after op 8 with it.
  EXPECT_FALSE(rule.Add(op(7, 0)));
  EXPECT_FALSE(rule.Add(NodeRecord{}));
  EXPECT_FALSE(rule.OnOp(op(8, 0), /*engine_wrapper=*/true));
  EXPECT_TRUE(rule.Add(op(9, 0)));
  // No backward since: no new step.
  EXPECT_FALSE(rule.Add(NodeRecord{}));
  EXPECT_FALSE(rule.Add(op(10, 0)));
}

// RecentIds, as an encoder and a decoder that see the same uses.
TEST(RecentIds, EncodesHowManyUsesAgoAndDecodesItBack) {
  RecentIds encoder, decoder;
  const std::vector<ObjectId> uses = {3, 8, 3, 3, 11, 8, 3};
  const std::vector<uint64_t> ago = {0, 0, 2, 1, 0, 4, 3};
  for (size_t i = 0; i < uses.size(); ++i) {
    EXPECT_EQ(encoder.Ago(uses[i]), ago[i]) << i;
    if (ago[i] != 0) EXPECT_EQ(decoder.At(ago[i]), uses[i]) << i;
    decoder.Use(uses[i]);
  }
  EXPECT_EQ(decoder.At(0), 0u);
  EXPECT_EQ(decoder.At(uses.size() + 1), 0u);  // Before the first use: none.
  EXPECT_EQ(decoder.At(RecentIds::kWindow + 1), 0u);
}

// 1.13 counts an id's uses among those of its kind: a tensor used again after a storage was
// used once ago among tensors (stored (1 + 1) << 2), where 1.11 counts two uses ago ((2 + 1) << 2).
// Both decode back, an id named as two kinds too.
TEST(RecentIds, ByKindCountsTheUsesOfTheIdsKind) {
  for (const auto& [coding, stored] :
       {std::pair{BatchCoding::kStepsRecent, uint64_t{12}},
        std::pair{BatchCoding::kStepsRecentByKind, uint64_t{8}}}) {
    StepCoding encoder, decoder;
    for (StepCoding* s : {&encoder, &decoder}) {
      s->recent_ids = true;
      s->recent_by_kind = coding == BatchCoding::kStepsRecentByKind;
    }
    IdCoder encode_ids, decode_ids;
    // The last use names tensor 5 as a storage, which no writer does: not recent among storages.
    const std::vector<std::pair<ObjectId, IdKind>> uses = {
        {5, IdKind::kTensor}, {9, IdKind::kStorage}, {5, IdKind::kTensor}, {5, IdKind::kStorage}};
    std::vector<uint64_t> codes;
    for (const auto& [id, kind] : uses) codes.push_back(encoder.EncodeId(encode_ids, id, kind));
    EXPECT_EQ(codes[2], stored) << static_cast<int>(coding);
    if (coding == BatchCoding::kStepsRecentByKind) EXPECT_EQ(codes[3] & 3, 2u);  // high - x.
    for (size_t i = 0; i < uses.size(); ++i) {
      EXPECT_EQ(decoder.DecodeId(decode_ids, codes[i], uses[i].second), uses[i].first) << i;
    }
  }
}

// 1.14 codes a node execution's times from its op's: the same times store 0 and 0; others, their
// distance from the op's (of either sign); before any op, from 0. A 1.13 batch codes them from
// the cursor. Both decode back, and the cursor moves to each time as before.
TEST(StepCoding, ExecTimesFromTheOpsTimes) {
  using Role = StepCoding::TimeRole;
  const std::vector<std::pair<int64_t, Role>> times = {
      {500, Role::kExecStart}, {700, Role::kExecEnd},  // Before any op.
      {1000, Role::kOpStart},  {1400, Role::kOpEnd},   {1000, Role::kExecStart},
      {1400, Role::kExecEnd},  {1500, Role::kOther},   {990, Role::kExecStart},
      {1403, Role::kExecEnd},  {1600, Role::kOther}};
  for (BatchCoding coding : {BatchCoding::kStepsRecentByKind, BatchCoding::kStepsExecTimes,
                             BatchCoding::kStepsPredictedTimes}) {
    StepCoding encoder, decoder;
    encoder.SetCoding(coding);
    decoder.SetCoding(coding);
    TimeCoder encode_times(100), decode_times(100);
    std::vector<uint64_t> codes;
    for (const auto& [t, role] : times) codes.push_back(encoder.EncodeTime(encode_times, t, role));
    if (coding >= BatchCoding::kStepsExecTimes) {  // 1.15 in the first step: as 1.14.
      EXPECT_EQ(codes, (std::vector<uint64_t>{1000, 1400, 600, 800, 0, 0, 200, 19, 6, 394}));
    } else {
      EXPECT_EQ(codes[4], 799u);  // 1000 - 1400 from the cursor, zigzag.
    }
    for (size_t i = 0; i < times.size(); ++i) {
      EXPECT_EQ(decoder.DecodeTime(decode_times, codes[i], times[i].second), times[i].first) << i;
      EXPECT_EQ(decode_times.cursor(), times[i].first) << i;
    }
  }
}

// 1.15 codes a step's k-th time from the least k-th difference of the two steps before it whose
// k-th time has the same op name; a step that runs other ops, or more of them, has no guess
// there. 1.14 codes the differences themselves. Both decode back.
TEST(StepCoding, TimesFromThePreviousSteps) {
  using Role = StepCoding::TimeRole;
  struct Op {
    InternId name;
    int64_t gap, duration;  // Start from the cursor, end from the start.
  };
  const std::vector<std::vector<Op>> steps = {
      {{7, 100, 50}, {8, 30, 40}},
      {{7, 110, 45}, {8, 30, 40}},
      {{7, 105, 52}, {8, 31, 40}},
      {{7, 99, 47}, {9, 30, 40}, {8, 30, 40}},  // Another op where 8 ran, and one more.
  };
  const std::vector<std::vector<int64_t>> want = {
      {100, 50, 30, 40},
      {10, -5, 0, 0},  // From step 0.
      {5, 7, 1, 0},    // From the least of steps 0 and 1.
      {-6, 2, 30, 40, 30, 40},  // From the least of steps 1 and 2; 9 and the third op new.
  };
  for (BatchCoding coding : {BatchCoding::kStepsExecTimes, BatchCoding::kStepsPredictedTimes}) {
    StepCoding encoder, decoder;
    encoder.SetCoding(coding);
    decoder.SetCoding(coding);
    TimeCoder encode_times(0), decode_times(0);
    int64_t t = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      std::vector<int64_t> deltas, stored;
      for (const Op& op : steps[s]) {
        encoder.op_name = op.name;
        for (auto [delta, role] :
             {std::pair{op.gap, Role::kOpStart}, std::pair{op.duration, Role::kOpEnd}}) {
          t += delta;
          deltas.push_back(delta);
          const uint64_t z = encoder.EncodeTime(encode_times, t, role);
          stored.push_back(static_cast<int64_t>(TimeCoder::Unzigzag(z)));
          decoder.op_name = op.name;
          EXPECT_EQ(decoder.DecodeTime(decode_times, z, role), t) << s;
          EXPECT_EQ(decode_times.cursor(), t);
        }
      }
      EXPECT_EQ(stored, coding == BatchCoding::kStepsPredictedTimes ? want[s] : deltas)
          << "step " << s;
      encoder.BeginStep();
      decoder.BeginStep();
    }
  }
}

// On steps that repeat with a few hundred nanoseconds of jitter, 1.15's time column is shorter
// than 1.14's, and reads back the same times.
TEST(StepCoding, RepeatingStepsTimesTakeLessIn115) {
  const std::vector<Record> records = TrainingSteps(8);
  size_t column[2] = {0, 0};
  for (BatchCoding coding : {BatchCoding::kStepsExecTimes, BatchCoding::kStepsPredictedTimes}) {
    BatchEncoder encoder(1 << 16, coding);
    encoder.Reset(0, 0);
    for (const Record& r : records) ASSERT_TRUE(encoder.Add(r).ok());
    std::span<uint8_t> payload = encoder.Finish();
    const auto* batch = flatbuffers::GetRoot<fb::RecordBatch>(payload.data());
    ASSERT_NE(batch->times(), nullptr);
    column[coding == BatchCoding::kStepsPredictedTimes] = batch->times()->size();
    std::vector<Record> decoded;
    EXPECT_FALSE(DecodeBatch(*batch, [&](const Record& r) { decoded.push_back(r); }).bad_coding);
    ExpectSameRecords(records, decoded);
  }
  // Each op's start and end: two bytes each in 1.14 (a gap or duration of microseconds), mostly
  // one in 1.15 (the jitter) after the first step.
  EXPECT_LT(column[1] * 10, column[0] * 8) << column[0] << " " << column[1];
}

// The encoder keeps the last uses of kWays ids per set (ids kSets apart): a third id of the set
// takes the slot of the one used longer ago, which is then coded in full at its next use and
// decodes all the same; an id used again and again keeps its slot.
TEST(RecentIds, AnIdThatLostItsSlotIsCodedInFullAndDecodes) {
  static_assert(RecentIds::kWays == 2);
  const ObjectId a = 7;
  const ObjectId b = a + RecentIds::kSets;
  const ObjectId c = a + 2 * RecentIds::kSets;
  const ObjectId d = a + 3 * RecentIds::kSets;
  // a is used at every other use and keeps its slot; c takes b's, d takes c's; b, used again
  // within the window, is coded in full.
  const std::vector<ObjectId> uses = {a, b, a, c, a, d, a, b};
  const std::vector<uint64_t> ago = {0, 0, 2, 0, 2, 0, 2, 0};
  RecentIds encoder, decoder;
  for (size_t i = 0; i < uses.size(); ++i) {
    EXPECT_EQ(encoder.Ago(uses[i]), ago[i]) << i;
    if (ago[i] != 0) EXPECT_EQ(decoder.At(ago[i]), uses[i]) << i;
    decoder.Use(uses[i]);
  }
  // A dropped record's uses are taken back, the slots they took included.
  encoder.Commit();
  EXPECT_EQ(encoder.Ago(a), 2u);
  EXPECT_EQ(encoder.Ago(c), 0u);  // Takes b's slot.
  encoder.Undo();
  EXPECT_EQ(encoder.Ago(b), 1u);
}

// Past kWindow uses the decoder's ring wraps: ids used half a window ago, and then a window ago,
// still decode to themselves; one used more than a window ago is no longer recent.
TEST(RecentIds, DecodesAcrossTheRingsWrap) {
  RecentIds encoder, decoder;
  const uint64_t half = RecentIds::kWindow / 2;
  size_t recent = 0;
  for (uint64_t i = 0; i < 3 * RecentIds::kWindow; ++i) {
    const ObjectId id = i < 2 * RecentIds::kWindow ? i % half + 1 : i % RecentIds::kWindow + 1;
    const uint64_t ago = encoder.Ago(id);
    if (ago != 0) {
      ++recent;
      ASSERT_EQ(decoder.At(ago), id) << i;
    }
    decoder.Use(id);
  }
  EXPECT_EQ(recent, 3 * RecentIds::kWindow - half - half);
}

}  // namespace
}  // namespace torchrr::format
