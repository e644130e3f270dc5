// Merging runs of adjacent ops (engine/coalesce.h): which ops join, and that the merged batch
// moves exactly the bytes of the original one.
#include "engine/coalesce.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace ferry::internal {
namespace {

uint64_t Joins(const std::vector<TransferOp>& ops) {
  JoinCounter c;
  for (const auto& o : ops) c.Add(o);
  return c.joins();
}

// Where each local byte goes: local offset -> remote offset, for every byte the ops move.
std::map<uint64_t, uint64_t> ByteMap(const std::vector<TransferOp>& ops) {
  std::map<uint64_t, uint64_t> m;
  for (const auto& o : ops)
    for (uint64_t i = 0; i < o.size; ++i) m[o.local_offset + i] = o.remote_offset + i;
  return m;
}

TEST(Coalesce, MergesRunsThatContinueOnBothSides) {
  std::vector<TransferOp> ops = {
      {0, 100, 10}, {10, 110, 10}, {20, 120, 5},  // one run
      {25, 200, 5},                                // continues locally only
      {40, 205, 5},                                // continues remotely only
      {45, 210, 0},                                // empty: dropped
      {45, 210, 3},                                // continues the op before the empty one
  };
  EXPECT_EQ(Joins(ops), 4u);
  auto merged = CoalesceOps(ops);
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].local_offset, 0u);
  EXPECT_EQ(merged[0].remote_offset, 100u);
  EXPECT_EQ(merged[0].size, 25u);
  EXPECT_EQ(merged[1].local_offset, 25u);
  EXPECT_EQ(merged[1].size, 5u);
  EXPECT_EQ(merged[2].local_offset, 40u);
  EXPECT_EQ(merged[2].remote_offset, 205u);
  EXPECT_EQ(merged[2].size, 8u);
  EXPECT_EQ(ops.size() - merged.size(), Joins(ops));
}

TEST(Coalesce, LeavesScatteredAndEmptyBatchesAlone) {
  EXPECT_TRUE(CoalesceOps({}).empty());
  EXPECT_EQ(Joins({}), 0u);
  std::vector<TransferOp> empties = {{0, 0, 0}, {5, 5, 0}};
  EXPECT_EQ(Joins(empties), 2u);
  EXPECT_TRUE(CoalesceOps(empties).empty());
  // A run backwards, and the same piece twice, do not join.
  std::vector<TransferOp> ops = {{100, 100, 10}, {90, 90, 10}, {90, 90, 10}};
  EXPECT_EQ(Joins(ops), 0u);
  EXPECT_EQ(CoalesceOps(ops).size(), 3u);
}

TEST(Coalesce, WorthItFromOneOpInEight) {
  EXPECT_FALSE(WorthCoalescing(0, 0));
  EXPECT_FALSE(WorthCoalescing(0, 100));
  EXPECT_FALSE(WorthCoalescing(12, 100));
  EXPECT_TRUE(WorthCoalescing(13, 100));
  EXPECT_TRUE(WorthCoalescing(1, 1));
}

// Random KV-like batches: blocks in runs of random length, with random breaks on either side.
TEST(Coalesce, RandomBatchesMoveTheSameBytes) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    std::vector<TransferOp> ops;
    uint64_t lo = 0, ro = 0;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      const uint64_t size = rng() % 5 == 0 ? 0 : 1 + rng() % 16;
      switch (rng() % 4) {
        case 0: lo += 1 + rng() % 8; break;   // a gap locally
        case 1: ro += 50 + rng() % 8; break;  // a jump remotely
        default: break;                       // continues
      }
      ops.push_back({lo, ro, size});
      lo += size;
      ro += size;
    }
    auto merged = CoalesceOps(ops);
    EXPECT_EQ(ByteMap(merged), ByteMap(ops)) << "round " << round;
    EXPECT_EQ(ops.size() - merged.size(), Joins(ops)) << "round " << round;
    uint64_t before = 0, after = 0;
    for (const auto& o : ops) before += o.size;
    for (const auto& o : merged) {
      after += o.size;
      EXPECT_GT(o.size, 0u);
    }
    EXPECT_EQ(before, after);
    // Nothing left to merge.
    EXPECT_EQ(Joins(merged), 0u);
  }
}

}  // namespace
}  // namespace ferry::internal
