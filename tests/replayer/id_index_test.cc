// The replay's index from a trace's object ids to its tables (replayer/src/id_index.h): dense for
// the ids a recorder hands out one after the other, a hash map for the others, and never larger
// than the ids a trace sets justify, whatever ids an untrusted trace names.
#include "id_index.h"

#include <gtest/gtest.h>

namespace torchrr::replayer {
namespace {

TEST(IdIndexTest, SequentialIdsAreDenseAndFound) {
  IdIndex index;
  for (uint32_t id = 1; id <= 100000; ++id) index.Set(id, IdKind::kOp, id * 2);
  EXPECT_GE(index.dense_size(), 100001u);
  for (uint32_t id = 1; id <= 100000; ++id) ASSERT_EQ(index.Find(id, IdKind::kOp), id * 2);
  EXPECT_EQ(index.Find(7, IdKind::kTensor), IdIndex::kAbsent);  // Another kind.
  EXPECT_EQ(index.Find(100001, IdKind::kOp), IdIndex::kAbsent);
}

// A trace of a few records whose ids double: each could grow a dense index to twice its size,
// up to 1 GiB; they stay in the hash map.
TEST(IdIndexTest, IdsThatSkipAheadDoNotGrowTheDenseIndex) {
  IdIndex index;
  std::vector<format::ObjectId> ids;
  for (format::ObjectId id = 1 << 16; id < (format::ObjectId{1} << 40); id *= 2) ids.push_back(id);
  for (size_t i = 0; i < ids.size(); ++i) index.Set(ids[i], IdKind::kStorage, i);
  EXPECT_LE(index.dense_size(), size_t{1} << 18);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(index.Find(ids[i], IdKind::kStorage), i);
}

}  // namespace
}  // namespace torchrr::replayer
