// The bench's batch layouts (bench_loop.h): every piece once on each side, runs kept whole.
#include "bench_loop.h"

#include <gtest/gtest.h>

#include <set>

namespace ferry::tools {
namespace {

TEST(PlanScatteredOps, CoversEverySlotOnceAndKeepsRunsWhole) {
  for (uint64_t run : {1, 4, 7, 64}) {
    for (uint64_t batch : {1, 10, 64, 1000}) {
      SCOPED_TRACE("run " + std::to_string(run) + ", batch " + std::to_string(batch));
      const uint64_t piece = 512;
      auto ops = PlanScatteredOps(piece, batch, run);
      ASSERT_EQ(ops.size(), batch);
      std::set<uint64_t> remote;
      uint64_t breaks = 0;
      for (uint64_t i = 0; i < batch; ++i) {
        EXPECT_EQ(ops[i].local_offset, i * piece);
        EXPECT_EQ(ops[i].size, piece);
        EXPECT_EQ(ops[i].remote_offset % piece, 0u);
        EXPECT_LT(ops[i].remote_offset, batch * piece);
        remote.insert(ops[i].remote_offset);
        if (i % run != 0) {
          EXPECT_EQ(ops[i].remote_offset, ops[i - 1].remote_offset + piece);  // inside a run
        } else if (i > 0 && ops[i].remote_offset != ops[i - 1].remote_offset + piece) {
          ++breaks;
        }
      }
      EXPECT_EQ(remote.size(), batch);  // a permutation of the slots
      // Runs are shuffled: with enough of them, most neighbours are apart.
      const uint64_t runs = (batch + run - 1) / run;
      if (runs >= 16) {
        EXPECT_GT(breaks, runs / 2);
      }
    }
  }
}

}  // namespace
}  // namespace ferry::tools
