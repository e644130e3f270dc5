// Engine::Metrics after known transfers, its Prometheus text parsed back, and Engine::InFlight
// with a transfer held in flight.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "engine/metrics.h"
#include "ferry/engine.h"
#include "testing/engine_pair.h"
#include "testing/held_engines.h"

namespace ferry {
namespace {

// Parses Prometheus text back: "name{labels}" -> value, checking every line's shape.
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ferry_", 0) == 0 || line.rfind("# TYPE ferry_", 0) == 0) << line;
      continue;
    }
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    if (sp == std::string::npos) continue;
    const std::string key = line.substr(0, sp);
    EXPECT_EQ(key.rfind("ferry_", 0), 0u) << line;
    EXPECT_EQ(std::count(key.begin(), key.end(), '{'), std::count(key.begin(), key.end(), '}')) << line;
    size_t used = 0;
    const double v = std::stod(line.substr(sp + 1), &used);
    EXPECT_EQ(used, line.size() - sp - 1) << line;
    EXPECT_TRUE(out.emplace(key, v).second) << "duplicate sample " << key;
  }
  return out;
}

const SeriesSnapshot* FindSeries(const MetricsSnapshot& m, std::string_view kind, std::string_view peer) {
  for (const auto& s : m.series)
    if (s.kind == kind && s.peer == peer) return &s;
  return nullptr;
}

TEST(Metrics, CountsTransfersByResultAndRendersThem) {
  auto p = testing::EnginePair::Make("local", 1 << 16);
  ASSERT_TRUE(p);
  constexpr int kWrites = 5;
  for (int i = 0; i < kWrites; ++i) ASSERT_TRUE(p->session.Write(0, 0, 4096).Wait().ok());
  const TransferOp two[] = {{0, 0, 1024}, {8192, 8192, 1024}};
  ASSERT_TRUE(p->session.WriteBatch(two).Wait().ok());
  EXPECT_EQ(p->session.Write(0, 1 << 16, 1).Wait().code(), Code::kOutOfRange);
  ASSERT_TRUE(p->a->Notify(p->b->key(), "hello").ok());

  const MetricsSnapshot m = p->a->Metrics();
  EXPECT_EQ(m.engine, p->a->key());
  const SeriesSnapshot* s = FindSeries(m, "transfer", p->b->key());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->transport, "local");
  EXPECT_EQ(s->results.at("OK"), kWrites + 1u);
  EXPECT_EQ(s->results.at("OUT_OF_RANGE"), 1u);
  EXPECT_EQ(s->results.size(), 2u);
  EXPECT_EQ(s->bytes, kWrites * 4096u + 2048u);  // the refused one moved nothing
  EXPECT_EQ(s->ops, kWrites + 2u);
  EXPECT_EQ(s->latency.count, kWrites + 2u);
  EXPECT_EQ(s->latency.counts.size(), s->latency.bounds_seconds.size() + 1);
  EXPECT_GT(s->latency.sum_seconds, 0.0);
  const SeriesSnapshot* n = FindSeries(m, "notification", p->b->key());
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->results.at("OK"), 1u);
  EXPECT_EQ(m.failures.at("out_of_range"), 1u);
  EXPECT_EQ(m.failures.at("deadline"), 0u);
  EXPECT_EQ(m.failures.at("peer_dead"), 0u);
  EXPECT_EQ(m.transfers_in_flight, 0u);
  EXPECT_EQ(m.peers, 1u);
  EXPECT_EQ(m.registered_regions, 1u);
  EXPECT_EQ(m.registered_bytes, 1u << 16);

  const auto parsed = Parse(RenderPrometheus(m));
  const std::string l = "engine=\"" + p->a->key() + "\",transport=\"local\",peer=\"" + p->b->key() + "\"";
  EXPECT_EQ(parsed.at("ferry_transfers_total{" + l + ",result=\"OK\"}"), kWrites + 1);
  EXPECT_EQ(parsed.at("ferry_transfers_total{" + l + ",result=\"OUT_OF_RANGE\"}"), 1);
  EXPECT_EQ(parsed.at("ferry_transfer_bytes_total{" + l + "}"), kWrites * 4096 + 2048);
  EXPECT_EQ(parsed.at("ferry_transfer_seconds_bucket{" + l + ",le=\"+Inf\"}"), kWrites + 2);
  EXPECT_EQ(parsed.at("ferry_transfer_seconds_count{" + l + "}"), kWrites + 2);
  EXPECT_EQ(parsed.at("ferry_transfer_seconds_bucket{" + l + ",le=\"10\"}"), kWrites + 2);
  EXPECT_EQ(parsed.at("ferry_failures_total{engine=\"" + p->a->key() + "\",cause=\"out_of_range\"}"), 1);
  EXPECT_EQ(parsed.at("ferry_registered_bytes{engine=\"" + p->a->key() + "\"}"), 1 << 16);
  // Buckets are cumulative.
  double last = 0;
  for (double b : s->latency.bounds_seconds) {
    char le[32];
    snprintf(le, sizeof(le), "%.9g", b);
    const double v = parsed.at("ferry_transfer_seconds_bucket{" + l + ",le=\"" + le + "\"}");
    EXPECT_GE(v, last);
    last = v;
  }
}

TEST(Metrics, HistogramBucketsAreFixed) {
  internal::Histogram h;
  h.Observe(500);            // <= 1 us
  h.Observe(1'000);          // <= 1 us (bounds are inclusive)
  h.Observe(3'000'000);      // <= 5 ms
  h.Observe(60'000'000'000);  // above 10 s
  const HistogramSnapshot s = h.Snapshot();
  ASSERT_EQ(s.counts.size(), internal::kLatencyBoundsNs.size() + 1);
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[11], 1u);  // (2.5 ms, 5 ms]
  EXPECT_EQ(s.counts.back(), 1u);
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.sum_seconds, 60.0030015, 1e-6);
}

TEST(Metrics, LabelValuesAreEscaped) {
  MetricsSnapshot m;
  m.engine = "a\"b\\c\nd";
  const std::string text = RenderPrometheus(m);
  EXPECT_NE(text.find("engine=\"a\\\"b\\\\c\\nd\""), std::string::npos) << text;
  Parse(text);
}

TEST(Metrics, FailureCauses) {
  EXPECT_EQ(FailureCause(Code::kOk), "");
  EXPECT_EQ(FailureCause(Code::kUnavailable), "peer_dead");
  EXPECT_EQ(FailureCause(Code::kDeadlineExceeded), "deadline");
  EXPECT_EQ(FailureCause(Code::kResourceExhausted), "rejected");
  EXPECT_EQ(FailureCause(Code::kOutOfRange), "out_of_range");
  EXPECT_EQ(FailureCause(Code::kAborted), "aborted");
  EXPECT_EQ(FailureCause(Code::kDataLoss), "other");
}

class MetricsHeldTest : public internal::HeldEnginesTest {};

TEST_F(MetricsHeldTest, InFlightListsAHeldTransferAndItsDeadlineIsCounted) {
  TransferOptions o;
  o.deadline = std::chrono::milliseconds(300);
  Transfer held = WriteLayer(1, o);
  Transfer done = WriteLayer(2);
  ASSERT_TRUE(this->held().Release(1));  // layer 2's
  ASSERT_TRUE(done.Wait().ok());

  const std::vector<InFlightTransfer> live = a_->in_flight();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].id, held.id());
  EXPECT_EQ(live[0].peer, b_->key());
  EXPECT_EQ(live[0].path.transport, "local");
  EXPECT_EQ(live[0].bytes, kLayer);
  EXPECT_GE(live[0].age, Duration::zero());
  EXPECT_LE(live[0].deadline_in, std::chrono::milliseconds(300));
  const std::string dump = RenderInFlight(live);
  EXPECT_NE(dump.find("1 transfer(s) in flight"), std::string::npos) << dump;
  EXPECT_NE(dump.find("id " + std::to_string(static_cast<uint64_t>(held.id())) + " peer " + b_->key()),
            std::string::npos) << dump;
  EXPECT_EQ(a_->metrics_snapshot().transfers_in_flight, 1u);

  // The held one passes its deadline: counted as a deadline, not a transport fault.
  EXPECT_EQ(held.Wait().code(), Code::kDeadlineExceeded);
  const MetricsSnapshot m = a_->metrics_snapshot();
  EXPECT_EQ(m.transfers_in_flight, 0u);
  EXPECT_TRUE(a_->in_flight().empty());
  EXPECT_EQ(m.failures.at("deadline"), 1u);
  EXPECT_EQ(m.failures.at("peer_dead"), 0u);
  const SeriesSnapshot* s = FindSeries(m, "transfer", b_->key());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->results.at("DEADLINE_EXCEEDED"), 1u);
  EXPECT_EQ(s->results.at("OK"), 1u);
}

TEST_F(MetricsHeldTest, APeerFailureIsCountedAsPeerDead) {
  Transfer t = WriteLayer(0);
  ASSERT_TRUE(held().Release(0, Status(Code::kUnavailable, "peer went away")));
  EXPECT_EQ(t.Wait().code(), Code::kUnavailable);
  const MetricsSnapshot m = a_->metrics_snapshot();
  EXPECT_EQ(m.failures.at("peer_dead"), 1u);
  EXPECT_EQ(m.failures.at("deadline"), 0u);
}

TEST_F(MetricsHeldTest, ATransferDroppedUnfinishedLeavesTheRegistry) {
  {
    Transfer t = WriteLayer(0);
    EXPECT_EQ(a_->in_flight().size(), 1u);
  }
  held().Clear();  // the held batch, and the last reference to its transfer, go
  EXPECT_TRUE(a_->in_flight().empty());
  EXPECT_EQ(a_->metrics_snapshot().failures.at("aborted"), 1u);
}

}  // namespace
}  // namespace ferry
