// StepPolicy with injected step times, StepStatsRecorder's buckets and medians, and the Stats
// message's round trip and malformed forms.
#include "embed/service/step_policy.h"

#include <gtest/gtest.h>

#include <vector>

#include "embed/service/protocol.h"
#include "embed/service/step_stats.h"

namespace ferry::embed::service {
namespace {

// Runs `steps` layer steps of `tokens` tokens, with the given time per path; the paths chosen.
std::vector<StepPath> Drive(StepPolicy& p, uint64_t tokens, int steps, uint64_t cpu_ns,
                            uint64_t uva_ns, bool uva_possible = true) {
  std::vector<StepPath> out;
  for (int i = 0; i < steps; ++i) {
    StepPath path = p.Choose(tokens, uva_possible);
    p.Report(tokens, path, path == StepPath::kUva ? uva_ns : cpu_ns);
    out.push_back(path);
  }
  return out;
}

int Count(const std::vector<StepPath>& v, StepPath p) {
  int n = 0;
  for (StepPath x : v) n += x == p;
  return n;
}

TEST(StepPolicyTest, ParsesModes) {
  EXPECT_EQ(*ParseUvaMode("off"), UvaMode::kOff);
  EXPECT_EQ(*ParseUvaMode("always"), UvaMode::kAlways);
  EXPECT_EQ(*ParseUvaMode("auto"), UvaMode::kAuto);
  EXPECT_EQ(ParseUvaMode("on").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(UvaModeName(UvaMode::kAlways), "always");
}

TEST(StepPolicyTest, ForcedModes) {
  StepPolicy off({UvaMode::kOff, 3, 8, 64});
  EXPECT_EQ(Count(Drive(off, 256, 20, 900, 100), StepPath::kUva), 0);
  StepPolicy always({UvaMode::kAlways, 3, 8, 64});
  EXPECT_EQ(Count(Drive(always, 256, 20, 100, 900), StepPath::kUva), 20);
  // A step that cannot run UVA runs on the CPU even when forced.
  EXPECT_EQ(Count(Drive(always, 256, 5, 100, 900, false), StepPath::kCpu), 5);
}

TEST(StepPolicyTest, ProbesBothThenPicksTheFaster) {
  StepPolicy p({UvaMode::kAuto, 3, 8, 0});
  std::vector<StepPath> v = Drive(p, 256, 6, 500, 200);
  // Probes alternate, CPU first.
  std::vector<StepPath> want = {StepPath::kCpu, StepPath::kUva, StepPath::kCpu,
                                StepPath::kUva, StepPath::kCpu, StepPath::kUva};
  EXPECT_EQ(v, want);
  EXPECT_EQ(Count(Drive(p, 256, 50, 500, 200), StepPath::kUva), 50);
  EXPECT_EQ(p.MedianNs(300, StepPath::kCpu), 500u);  // 300 tokens: the same bucket as 256
  EXPECT_EQ(p.MedianNs(300, StepPath::kUva), 200u);
}

TEST(StepPolicyTest, BucketsChooseApart) {
  StepPolicy p({UvaMode::kAuto, 2, 8, 0});
  Drive(p, 256, 10, 500, 200);     // decode: UVA wins
  Drive(p, 8192, 10, 1000, 4000);  // prefill: CPU wins
  EXPECT_EQ(Count(Drive(p, 300, 20, 500, 200), StepPath::kUva), 20);
  EXPECT_EQ(Count(Drive(p, 9000, 20, 1000, 4000), StepPath::kCpu), 20);
  // A bucket never seen starts with probes again.
  EXPECT_EQ(p.Choose(64, true), StepPath::kCpu);
}

TEST(StepPolicyTest, ReprobesAndFollowsAChange) {
  StepPolicy p({UvaMode::kAuto, 2, 4, 10});
  Drive(p, 1024, 4, 300, 600);  // probes: CPU faster
  std::vector<StepPath> v = Drive(p, 1024, 40, 300, 600);
  EXPECT_EQ(Count(v, StepPath::kUva), 4);  // every 10th choice re-probes UVA
  // UVA became faster (another table, another load): the re-probes see it and it takes over.
  v = Drive(p, 1024, 100, 300, 100);
  EXPECT_GE(Count(std::vector<StepPath>(v.end() - 40, v.end()), StepPath::kUva), 36);
}

TEST(StepPolicyTest, NoUvaStepsDoNotCountAsProbes) {
  StepPolicy p({UvaMode::kAuto, 2, 8, 0});
  Drive(p, 256, 10, 500, 200, false);
  // Still probing: UVA has no samples, so it is chosen next.
  EXPECT_EQ(p.Choose(256, true), StepPath::kUva);
}

TEST(StepStatsTest, BucketsAndMedians) {
  EXPECT_EQ(TokenBucket(0), 0u);
  EXPECT_EQ(TokenBucket(1), 1u);
  EXPECT_EQ(TokenBucket(8191), 4096u);
  EXPECT_EQ(TokenBucket(8192), 8192u);
  StepStatsRecorder r;
  for (int i = 1; i <= 5; ++i) {
    LayerTiming t;
    t.tokens = 8192;
    t.path = i == 5 ? StepPath::kUva : StepPath::kCpu;
    t.Set(Phase::kGather, i * 100);
    t.Set(Phase::kLayer, i * 1000);
    r.Commit(t);
  }
  LayerTiming small;
  small.tokens = 256;
  small.Set(Phase::kLayer, 42);
  r.Commit(small);
  std::vector<BucketStats> s = r.Snapshot(true);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].bucket, 256u);
  EXPECT_EQ(s[1].bucket, 8192u);
  EXPECT_EQ(s[1].cpu_steps, 4u);
  EXPECT_EQ(s[1].uva_steps, 1u);
  const PhaseSummary& g = s[1].phases[static_cast<size_t>(Phase::kGather)];
  EXPECT_EQ(g.count, 5u);
  EXPECT_EQ(g.sum_ns, 1500u);
  EXPECT_EQ(g.median_ns, 300u);
  EXPECT_EQ(s[1].phases[static_cast<size_t>(Phase::kDone)].count, 0u);  // never measured
  EXPECT_TRUE(r.Snapshot(false).empty());                               // reset
}

TEST(StepStatsTest, MedianOfTheLastSamples) {
  StepStatsRecorder r;
  for (uint64_t i = 0; i < kStatSamples + 100; ++i) {
    LayerTiming t;
    t.tokens = 4;
    t.Set(Phase::kStep, i < 100 ? 1000000 : 7);
    r.Commit(t);
  }
  auto s = r.Snapshot(false);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].phases[static_cast<size_t>(Phase::kStep)].median_ns, 7u);
  EXPECT_EQ(s[0].phases[static_cast<size_t>(Phase::kStep)].count, kStatSamples + 100);
}

TEST(StatsMessageTest, RoundTrip) {
  Stats m;
  m.stats.registrations = 3;
  m.stats.live_clients = 2;
  m.stats.steps_ok = 10;
  m.stats.steps_failed = 1;
  BucketStats b;
  b.bucket = 256;
  b.cpu_steps = 4;
  b.uva_steps = 6;
  b.copies = 17;
  b.phases[static_cast<size_t>(Phase::kLayer)] = {10, 12345, 1200};
  m.stats.buckets = {b};
  Result<AnyMessage> d = Decode(Encode(m));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const ServerStats& s = std::get<Stats>(*d).stats;
  EXPECT_EQ(s.registrations, 3u);
  EXPECT_EQ(s.steps_failed, 1u);
  ASSERT_EQ(s.buckets.size(), 1u);
  EXPECT_EQ(s.buckets[0].uva_steps, 6u);
  EXPECT_EQ(s.buckets[0].copies, 17u);
  EXPECT_EQ(s.buckets[0].phases[static_cast<size_t>(Phase::kLayer)].sum_ns, 12345u);
  EXPECT_EQ(s.buckets[0].phases[static_cast<size_t>(Phase::kLayer)].median_ns, 1200u);
  Result<AnyMessage> q = Decode(Encode(StatsRequest{true}));
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(std::get<StatsRequest>(*q).reset);
}

TEST(StatsMessageTest, MalformedBucketsAreRejected) {
  Stats m;
  BucketStats a, b;
  a.bucket = 512;
  b.bucket = 256;  // out of order
  m.stats.buckets = {a, b};
  EXPECT_EQ(Decode(Encode(m)).status().code(), Code::kInvalidArgument);
  m.stats.buckets = {a};
  m.stats.buckets[0].bucket = 300;  // not a power of two
  EXPECT_EQ(Decode(Encode(m)).status().code(), Code::kInvalidArgument);
  std::string bytes = Encode(Stats{});
  EXPECT_EQ(Decode(bytes.substr(0, bytes.size() - 1)).status().code(), Code::kInvalidArgument);
}

TEST(StatsMessageTest, EveryPrefixAndByteFlipIsHandled) {
  Stats m;
  m.stats.steps_ok = 7;
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{256}, uint64_t{8192}}) {
    BucketStats x;
    x.bucket = b;
    x.cpu_steps = b + 1;
    x.phases[static_cast<size_t>(Phase::kGather)] = {3, 300000, 100000};
    m.stats.buckets.push_back(x);
  }
  const std::string bytes = Encode(m);
  ASSERT_TRUE(Decode(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(Decode(bytes.substr(0, n)).status().code(), Code::kInvalidArgument) << n;
  // Flipped bytes decode to an error or to some stats that pass the checks; never more buckets
  // than the limit or out of order.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    Result<AnyMessage> d = Decode(bad);
    if (!d.ok() || !std::holds_alternative<Stats>(*d)) continue;
    const auto& buckets = std::get<Stats>(*d).stats.buckets;
    EXPECT_LE(buckets.size(), kMaxStatBuckets);
    for (size_t k = 1; k < buckets.size(); ++k) EXPECT_LT(buckets[k - 1].bucket, buckets[k].bucket);
  }
}

}  // namespace
}  // namespace ferry::embed::service
