// The service's Prometheus text (RenderPrometheus): rendered while a host-mode (CPU) run steps,
// as a scrape would, and checked afterwards against the counters: every histogram is
// cumulative, its +Inf bucket and _count equal the phase's sample count.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <sstream>
#include <thread>

#include "ferry/embed_stats.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;
using EmbedStatsPrometheusTest = SmallServiceTest;

// "name{labels}" -> value, each line checked for its shape.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) {
      EXPECT_TRUE(line.rfind("# HELP ferry_embed_", 0) == 0 || line.rfind("# TYPE ferry_embed_", 0) == 0) << line;
      continue;
    }
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

TEST_F(EmbedStatsPrometheusTest, ScrapedDuringACpuRunHistogramsMatchTheCounts) {
  auto c = MakeClient(0, 0, 1);
  ASSERT_TRUE(c);
  std::atomic<bool> done{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = RenderPrometheus(server_->stats(), "node0");
      EXPECT_NE(text.find("# TYPE ferry_embed_phase_seconds histogram"), std::string::npos);
      scrapes.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (uint32_t i = 0; i < 6; ++i) Forward({c.get()}, MakeStep(4, 300, i));  // bucket 256
  for (int i = 0; i < 500 && server_->stats().steps_ok < 6; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  done.store(true);
  scraper.join();
  EXPECT_GT(scrapes.load(), 0);

  const ServerStats st = server_->stats();
  ASSERT_EQ(st.buckets.size(), 1u);
  const auto s = Samples(RenderPrometheus(st, "node0"));
  EXPECT_EQ(s.at("ferry_embed_steps_total{service=\"node0\",result=\"ok\"}"), 6.0);
  EXPECT_EQ(s.at("ferry_embed_live_clients{service=\"node0\"}"), 1.0);
  EXPECT_EQ(s.at("ferry_embed_layer_steps_total{service=\"node0\",bucket=\"256\",path=\"cpu\"}"), 18.0);
  EXPECT_EQ(s.at("ferry_embed_layer_steps_total{service=\"node0\",bucket=\"256\",path=\"uva\"}"), 0.0);
  for (Phase p : {Phase::kQueue, Phase::kGather, Phase::kLayer, Phase::kStep}) {
    const PhaseSummary& ph = st.buckets[0].phases[static_cast<size_t>(p)];
    const std::string l = "service=\"node0\",bucket=\"256\",phase=\"" + std::string(PhaseName(p)) + "\"";
    EXPECT_EQ(s.at("ferry_embed_phase_seconds_count{" + l + "}"), static_cast<double>(ph.count));
    EXPECT_EQ(s.at("ferry_embed_phase_seconds_bucket{" + l + ",le=\"+Inf\"}"), static_cast<double>(ph.count));
    EXPECT_NEAR(s.at("ferry_embed_phase_seconds_sum{" + l + "}"), ph.sum_ns / 1e9, 1e-6);
    double previous = 0;
    uint64_t in_buckets = 0;
    for (size_t i = 0; i < kPhaseBoundsNs.size(); ++i) {
      char le[32];
      std::snprintf(le, sizeof(le), "%.9g", kPhaseBoundsNs[i] / 1e9);
      const double v = s.at("ferry_embed_phase_seconds_bucket{" + l + ",le=\"" + le + "\"}");
      EXPECT_GE(v, previous);
      previous = v;
      in_buckets += ph.histogram[i];
    }
    EXPECT_EQ(in_buckets + ph.histogram.back(), ph.count);
  }
  EXPECT_EQ(st.buckets[0].phases[static_cast<size_t>(Phase::kQueue)].count, 6u);
  // Unnamed: no service label.
  EXPECT_NE(RenderPrometheus(st).find("ferry_embed_live_clients 1\n"), std::string::npos);
}

TEST(EmbedStatsPrometheus, LabelValuesAreEscaped) {
  const std::string text = RenderPrometheus(ServerStats{}, "a\"b\\c\nd");
  EXPECT_NE(text.find("ferry_embed_live_clients{service=\"a\\\"b\\\\c\\nd\"} 0\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace ferry::embed::service
