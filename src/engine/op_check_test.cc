#include "engine/op_check.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/coalesce.h"

namespace ferry::internal {
namespace {

// The single-threaded definition the parallel check must agree with.
OpCheck Reference(const std::vector<TransferOp>& ops, uint64_t local_size, uint64_t remote_size) {
  OpCheck c;
  JoinCounter joins;
  for (const TransferOp& o : ops) {
    if (!(o.local_offset <= local_size && o.size <= local_size - o.local_offset) ||
        !(o.remote_offset <= remote_size && o.size <= remote_size - o.remote_offset) ||
        __builtin_add_overflow(c.total, o.size, &c.total)) {
      c.ok = false;
      return c;
    }
    joins.Add(o);
  }
  c.joins = joins.joins();
  return c;
}

std::vector<TransferOp> Runs(size_t n, uint64_t piece, size_t run, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TransferOp> ops(n);
  uint64_t remote = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % run == 0) remote = (rng() % n) * piece * 2;  // a run starts somewhere else remotely
    ops[i] = {i * piece, remote, piece};
    remote += piece;
    if (rng() % 97 == 0) ops[i].size = 0;  // empty ops count as joins
  }
  return ops;
}

TEST(OpCheck, LargeBatchesAgreeWithOneThreadAndCopyEveryOp) {
  for (size_t n : {size_t{1}, size_t{100}, kParallelCheckOps - 1, kParallelCheckOps, size_t{80'000}, size_t{4096 * 7 + 1}}) {
    for (size_t run : {size_t{1}, size_t{16}, size_t{4096}, size_t{5000}}) {
      const auto ops = Runs(n, 64, run, n + run);
      const uint64_t size = n * 64 * 4;
      std::vector<TransferOp> out(n);
      const OpCheck got = CopyAndCheckOps(ops, out.data(), size, size);
      const OpCheck want = Reference(ops, size, size);
      ASSERT_TRUE(got.ok) << n << " ops, runs of " << run;
      EXPECT_EQ(got.total, want.total) << n << " ops, runs of " << run;
      EXPECT_EQ(got.joins, want.joins) << n << " ops, runs of " << run;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i].local_offset, ops[i].local_offset);
        ASSERT_EQ(out[i].remote_offset, ops[i].remote_offset);
        ASSERT_EQ(out[i].size, ops[i].size);
      }
    }
  }
}

TEST(OpCheck, JoinsAcrossShareBoundariesAreCounted) {
  // One run over the whole batch: every op but the first joins, whichever thread checks it.
  std::vector<TransferOp> ops(80'000);
  for (size_t i = 0; i < ops.size(); ++i) ops[i] = {i * 8, i * 8, 8};
  const OpCheck got = CopyAndCheckOps(ops, ops.data(), ops.size() * 8, ops.size() * 8);
  ASSERT_TRUE(got.ok);
  EXPECT_EQ(got.joins, ops.size() - 1);
  EXPECT_EQ(got.total, ops.size() * 8);
}

TEST(OpCheck, OneOpOutsideEitherRegionAnywhereFailsTheBatch) {
  for (size_t bad : {size_t{0}, size_t{4095}, size_t{4096}, size_t{40'000}, size_t{79'999}}) {
    for (bool local : {true, false}) {
      std::vector<TransferOp> ops(80'000);
      for (size_t i = 0; i < ops.size(); ++i) ops[i] = {i * 8, i * 8, 8};
      (local ? ops[bad].local_offset : ops[bad].remote_offset) = ops.size() * 8 - 4;  // 4 bytes past the end
      std::vector<TransferOp> out(ops.size());
      EXPECT_FALSE(CopyAndCheckOps(ops, out.data(), ops.size() * 8, ops.size() * 8).ok) << bad << " " << local;
    }
  }
}

TEST(OpCheck, ASumOverflowingSixtyFourBitsFailsTheBatch) {
  const uint64_t huge = uint64_t{1} << 62;
  std::vector<TransferOp> ops(kParallelCheckOps + 5, TransferOp{0, 0, 0});
  for (size_t i = 0; i < 4; ++i) ops[i * 5000] = {0, 0, huge};  // in different shares
  std::vector<TransferOp> out(ops.size());
  EXPECT_FALSE(CopyAndCheckOps(ops, out.data(), huge, huge).ok);
  ops[15000].size = 0;  // three of them fit
  EXPECT_TRUE(CopyAndCheckOps(ops, out.data(), huge, huge).ok);
}

}  // namespace
}  // namespace ferry::internal
