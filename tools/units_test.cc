#include "units.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ferry::tools {
namespace {

TEST(ParseBytes, AcceptsBinaryUnits) {
  EXPECT_EQ(ParseBytes("4096").value(), 4096u);
  EXPECT_EQ(ParseBytes("4K").value(), 4096u);
  EXPECT_EQ(ParseBytes("4k").value(), 4096u);
  EXPECT_EQ(ParseBytes("64KiB").value(), 65536u);
  EXPECT_EQ(ParseBytes("1MB").value(), 1u << 20);
  EXPECT_EQ(ParseBytes(" 2G ").value(), 2ull << 30);
  EXPECT_EQ(ParseBytes("8B").value(), 8u);
}

TEST(ParseBytes, RejectsBadInput) {
  EXPECT_EQ(ParseBytes("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytes("0").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytes("4X").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytes("K").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytes("-4K").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytes("99999999999T").status().code(), Code::kInvalidArgument);
}

TEST(ParseBytesList, ListsAndRanges) {
  EXPECT_EQ(ParseBytesList("4K,1M").value(), (std::vector<uint64_t>{4096, 1 << 20}));
  EXPECT_EQ(ParseBytesList("4K..64M").value(),
            (std::vector<uint64_t>{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20,
                                   16 << 20, 64 << 20}));
  EXPECT_EQ(ParseBytesList("1K..4K:2").value(), (std::vector<uint64_t>{1024, 2048, 4096}));
  EXPECT_EQ(ParseBytesList("4K..5K").value(), (std::vector<uint64_t>{4096}));
  EXPECT_EQ(ParseBytesList("64K..4K").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytesList("4K..64K:1").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseBytesList("4K,,8K").status().code(), Code::kInvalidArgument);
}

TEST(ParseCountList, PositiveIntegers) {
  EXPECT_EQ(ParseCountList("1,16,256").value(), (std::vector<uint64_t>{1, 16, 256}));
  EXPECT_EQ(ParseCountList("0").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseCountList("4x").status().code(), Code::kInvalidArgument);
}

TEST(FormatBytes, PicksTheLargestUnit) {
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(1ull << 30), "1 GiB");
}

TEST(ParseSeconds, TakesFiniteTimesInRange) {
  using std::chrono::nanoseconds;
  EXPECT_EQ(ParseSeconds(30, "--deadline").value(), std::chrono::seconds(30));
  EXPECT_EQ(ParseSeconds(0.25, "--deadline").value(), std::chrono::milliseconds(250));
  EXPECT_EQ(ParseSeconds(1e-12, "--deadline").value(), nanoseconds(1));  // positive stays positive
  EXPECT_EQ(ParseSeconds(0, "--min-time", true).value(), nanoseconds(0));
  EXPECT_EQ(ParseSeconds(86400, "--deadline").value(), std::chrono::hours(24));
}

TEST(ParseSeconds, RejectsNonFiniteNegativeZeroAndHugeTimes) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {std::nan(""), inf, -inf, 1e300, 86401.0, -1.0, -0.0, 0.0}) {
    auto r = ParseSeconds(bad, "--deadline");
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--deadline"), std::string_view::npos) << r.status().ToString();
  }
  EXPECT_EQ(ParseSeconds(-1, "--min-time", true).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseSeconds(std::nan(""), "--min-time", true).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseSeconds(10, "--x", false, std::chrono::seconds(5)).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::tools
