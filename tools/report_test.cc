#include "report.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ferry::tools {
namespace {

TEST(Summarize, NearestRankPercentiles) {
  std::vector<double> us(100);
  std::iota(us.begin(), us.end(), 1.0);  // 1 .. 100
  std::reverse(us.begin(), us.end());
  LatencySummary s = Summarize(us);
  EXPECT_EQ(s.samples, 100u);
  EXPECT_DOUBLE_EQ(s.min_us, 1);
  EXPECT_DOUBLE_EQ(s.median_us, 50);
  EXPECT_DOUBLE_EQ(s.p99_us, 99);
  EXPECT_DOUBLE_EQ(s.max_us, 100);
  EXPECT_DOUBLE_EQ(s.mean_us, 50.5);
}

TEST(Summarize, SmallAndEmpty) {
  std::vector<double> one = {7};
  EXPECT_DOUBLE_EQ(Summarize(one).p99_us, 7);
  std::vector<double> none;
  EXPECT_EQ(Summarize(none).samples, 0u);
}

TEST(Gigabytes, PerSecond) {
  EXPECT_DOUBLE_EQ(GigabytesPerSecond(2e9, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(GigabytesPerSecond(1, 0), 0.0);
}

}  // namespace
}  // namespace ferry::tools
