// The allocator, the summary and the line channel of `ferry pd`.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <thread>

#include "pd_alloc.h"
#include "pd_channel.h"
#include "pd_summary.h"

namespace ferry::tools::pd {
namespace {

TEST(BlockAllocator, AllocatesAllOrNothingAndRefusesBadFrees) {
  BlockAllocator a(8);
  auto x = a.Allocate(5).value();
  EXPECT_EQ(x, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(a.Allocate(4).has_value());
  EXPECT_EQ(a.allocated(), 5u);
  EXPECT_EQ(a.Free(std::vector<uint64_t>{8}).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.Free(std::vector<uint64_t>{5}).code(), Code::kInvalidArgument);     // not allocated
  EXPECT_EQ(a.Free(std::vector<uint64_t>{1, 1}).code(), Code::kInvalidArgument);  // twice
  EXPECT_EQ(a.allocated(), 5u);  // nothing freed by a refused call
  EXPECT_TRUE(a.Free(std::vector<uint64_t>{3, 1}).ok());
  // First in, first out: the freed blocks come back after the ones never used.
  EXPECT_EQ(a.Allocate(4).value(), (std::vector<uint64_t>{5, 6, 7, 3}));
  EXPECT_EQ(a.free_count(), 1u);
  EXPECT_TRUE(a.Allocate(0).value().empty());
}

TEST(Summary, PercentilesAreNearestRank) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.5), 50);
  EXPECT_EQ(Percentile(v, 0.99), 99);
  EXPECT_EQ(Percentile(v, 1.0), 100);
}

TEST(Summary, CountsAndJudgesTheRun) {
  std::vector<RequestRecord> r(4);
  for (uint64_t i = 0; i < 4; ++i) r[i] = {i, 10, RequestEnd::kDone, 100.0 * (i + 1), 1000, 0, ""};
  std::vector<WorkerRecord> w(2);
  w[0].id = "p0/dp0/tp0";
  w[1].id = "d0/dp0/tp0";
  w[1].prefill = false;
  RunFacts facts;
  facts.seconds = 2;
  Summary s = Summarize(r, w, facts);
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.done, 4u);
  EXPECT_EQ(s.exposed_p50_us, 200);
  EXPECT_EQ(s.exposed_p99_us, 400);
  EXPECT_EQ(s.bytes_per_s, 2000);
  nlohmann::json j = ToJson(s, w, facts);
  EXPECT_EQ(j["done"], 4);
  EXPECT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["exposed_us"]["p99"], 400.0);

  // A failed request is a failure outside a fault run, not in one; a stuck one always is.
  r[1].end = RequestEnd::kFailed;
  EXPECT_FALSE(Summarize(r, w, facts).ok);
  facts.fault_run = true;
  facts.killed = "p0/dp0/tp0";
  EXPECT_TRUE(Summarize(r, w, facts).ok);
  r[2].end = RequestEnd::kStuck;
  EXPECT_FALSE(Summarize(r, w, facts).ok);
  r[2].end = RequestEnd::kDone;
  // A bad byte, a leaked block, a pending request on a survivor: each fails the run.
  r[3].bad_bytes = 1;
  EXPECT_EQ(Summarize(r, w, facts).verify_failures, 1u);
  EXPECT_FALSE(Summarize(r, w, facts).ok);
  r[3].bad_bytes = 0;
  w[1].held_blocks = 3;
  EXPECT_EQ(Summarize(r, w, facts).blocks_leaked, 3u);
  w[1].held_blocks = 0;
  w[1].pending = 1;
  EXPECT_FALSE(Summarize(r, w, facts).ok);
  w[1].pending = 0;
  // The killed worker's state does not count.
  w[0].killed = true;
  w[0].alive = false;
  w[0].held_blocks = 9;
  EXPECT_TRUE(Summarize(r, w, facts).ok);
}

TEST(LineChannel, CarriesJsonLinesAndSeesThePeerClose) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  LineChannel a(fds[0]);
  auto b = std::make_unique<LineChannel>(fds[1]);
  ASSERT_TRUE(a.Send({{"t", "hello"}, {"n", 3}, {"blocks", {1, 2, 7}}}).ok());
  ASSERT_TRUE(a.Send({{"t", "second"}}).ok());
  std::vector<nlohmann::json> got;
  for (int i = 0; i < 50 && got.size() < 2; ++i)
    ASSERT_TRUE(b->Receive(&got, std::chrono::milliseconds(100)).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(TypeOf(got[0]), "hello");
  uint64_t n = 0;
  EXPECT_TRUE(GetU64(got[0], "n", &n));
  EXPECT_EQ(n, 3u);
  std::vector<uint64_t> blocks;
  EXPECT_TRUE(GetBlocks(got[0], "blocks", 8, 16, &blocks));
  EXPECT_EQ(blocks, (std::vector<uint64_t>{1, 2, 7}));
  EXPECT_FALSE(GetBlocks(got[0], "blocks", 7, 16, &blocks));  // 7 is out of range
  EXPECT_FALSE(GetBlocks(got[0], "blocks", 8, 2, &blocks));   // too many
  std::string s;
  EXPECT_FALSE(GetString(got[0], "n", &s));
  EXPECT_EQ(TypeOf(got[1]), "second");
  // Nothing more: an empty, successful wait.
  got.clear();
  EXPECT_TRUE(b->Receive(&got, std::chrono::milliseconds(10)).ok());
  EXPECT_TRUE(got.empty());
  // Garbage is refused.
  ASSERT_EQ(write(fds[1], "not json\n", 9), 9);
  Status bad = a.Receive(&got, std::chrono::milliseconds(1000));
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  // The peer's close reads as kUnavailable, within the wait.
  b.reset();
  Status closed;
  for (int i = 0; i < 50 && closed.ok(); ++i)
    closed = a.Receive(&got, std::chrono::milliseconds(100));
  EXPECT_EQ(closed.code(), Code::kUnavailable);
  EXPECT_EQ(a.Send({{"t", "late"}}).code(), Code::kUnavailable);
}

TEST(LineChannel, HexRoundTrips) {
  const std::string bytes(
      "\x00\x01\xfe\xff"
      "abc",
      7);
  EXPECT_EQ(ToHex(bytes), "0001feff616263");
  std::string back;
  EXPECT_TRUE(FromHex(ToHex(bytes), &back));
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(FromHex("abc", &back));
  EXPECT_FALSE(FromHex("zz", &back));
  EXPECT_FALSE(FromHex("AB", &back));
}

}  // namespace
}  // namespace ferry::tools::pd
