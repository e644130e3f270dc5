#include "pd_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "pd_arrivals.h"

namespace ferry::tools::pd {
namespace {

TEST(Presets, HaveTheModelsShapes) {
  Preset p = FindPreset("llama-3.1-8b").value();
  EXPECT_EQ(p.layers, 32u);
  EXPECT_EQ(p.kv_heads, 8u);
  EXPECT_EQ(p.head_dim, 128u);
  EXPECT_EQ(p.block_tokens, 16u);
  EXPECT_FALSE(p.mla);
  // 32 layers x (K, V) x 8 heads x 128 x 2 bytes = 128 KiB a token.
  EXPECT_EQ(TokenBytes(p, 8), 128u * 1024);
  Preset mla = FindPreset("deepseek-v3").value();
  EXPECT_TRUE(mla.mla);
  EXPECT_EQ(mla.layers, 61u);
  EXPECT_EQ(mla.head_dim, 576u);
  EXPECT_EQ(TokenBytes(mla, 1), 61u * 576 * 2);
  EXPECT_TRUE(FindPreset("tiny").ok());
  EXPECT_TRUE(FindPreset("tiny-mla").value().mla);
  Status s = FindPreset("gpt-5").status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("llama-3.1-70b"), std::string_view::npos);
}

TEST(HeadsOf, SplitsOrReplicates) {
  EXPECT_EQ(HeadsOf(8, false, 1, 0).count, 8u);
  EXPECT_EQ(HeadsOf(8, false, 2, 1).first, 4u);
  EXPECT_EQ(HeadsOf(8, false, 2, 1).count, 4u);
  // TP 16 over 8 heads: ranks 2h and 2h+1 hold head h.
  EXPECT_EQ(HeadsOf(8, false, 16, 5).first, 2u);
  EXPECT_EQ(HeadsOf(8, false, 16, 5).count, 1u);
  // MLA: the one latent on every rank.
  EXPECT_EQ(HeadsOf(1, true, 4, 3).first, 0u);
  EXPECT_EQ(HeadsOf(1, true, 4, 3).count, 1u);
  Preset tiny = FindPreset("tiny").value();
  EXPECT_TRUE(CheckTpSplit(tiny, 2, "--prefill-tp").ok());
  EXPECT_TRUE(CheckTpSplit(tiny, 8, "--prefill-tp").ok());
  Status s = CheckTpSplit(tiny, 3, "--decode-tp");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("--decode-tp"), std::string_view::npos);
}

PdFlags Small() {
  PdFlags f;
  f.requests = 4;
  f.prompt_tokens = "20..40";
  return f;
}

TEST(Configure, TakesTheDefaultsOfThePreset) {
  PdConfig c = Configure(Small()).value();
  EXPECT_EQ(c.preset.name, "tiny");
  EXPECT_EQ(c.prefill.block_tokens, 16u);
  EXPECT_EQ(c.decode.block_tokens, 16u);
  EXPECT_EQ(c.arrivals.size(), 4u);
  EXPECT_EQ(c.prefill.blocks, 64u);  // at least 64
  PdFlags f = Small();
  f.block_tokens = 32;
  f.decode_block_tokens = 8;
  f.model = "tiny-mla";
  c = Configure(f).value();
  EXPECT_EQ(c.prefill.block_tokens, 32u);
  EXPECT_EQ(c.decode.block_tokens, 8u);
  EXPECT_EQ(c.prefill.layout, "mla");
  EXPECT_EQ(c.decode.layout, "mla");
  EXPECT_FALSE(c.fault_run());
  f = Small();
  f.stop_prefill_after = 2;
  f.stop_ms = 1500.4;
  c = Configure(f).value();
  EXPECT_TRUE(c.fault_run());
  EXPECT_EQ(c.stop_prefill_after, 2u);
  EXPECT_EQ(c.stop_time, std::chrono::milliseconds(1500));
}

// refused(flags, text): Configure fails with kInvalidArgument and a message holding `text`.
void ExpectRefused(const PdFlags& f, std::string_view text) {
  Status s = Configure(f).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << text;
  EXPECT_NE(s.message().find(text), std::string_view::npos) << s.ToString();
}

TEST(Configure, RefusesBadFlagsNamingThem) {
  PdFlags f = Small();
  f.prefill = 0;
  ExpectRefused(f, "--prefill");
  f = Small(), f.decode_tp = 3;
  ExpectRefused(f, "--decode-tp");
  f = Small(), f.memory = "disk";
  ExpectRefused(f, "--memory");
  f = Small(), f.memory = "gpu";
  ExpectRefused(f, "--transport shm");
  f = Small(), f.transport = "tcp";
  ExpectRefused(f, "--transport");
  f = Small(), f.mode = "push";
  ExpectRefused(f, "--mode");
  f = Small(), f.rate = std::nan("");
  ExpectRefused(f, "--rate");
  f = Small(), f.rate = -1;
  ExpectRefused(f, "--rate");
  f = Small(), f.requests = 0;
  ExpectRefused(f, "--requests");
  f = Small(), f.prompt_tokens = "40..20";
  ExpectRefused(f, "--prompt-tokens");
  f = Small(), f.layer_us = std::numeric_limits<double>::infinity();
  ExpectRefused(f, "--layer-us");
  f = Small(), f.timeout_s = 0;
  ExpectRefused(f, "--timeout");
  f = Small(), f.transfer_timeout_s = -1;
  ExpectRefused(f, "--transfer-timeout");
  f = Small(), f.kill_prefill_after = 4;
  ExpectRefused(f, "--kill-prefill-after");
  f = Small(), f.kill_decode_after = 4;
  ExpectRefused(f, "--kill-decode-after");
  f = Small(), f.stop_prefill_after = 4;
  ExpectRefused(f, "--stop-prefill-after");
  f = Small(), f.stop_ms = std::nan("");
  ExpectRefused(f, "--stop-ms");
  f = Small(), f.stop_ms = -1;
  ExpectRefused(f, "--stop-ms");
  f = Small(), f.prefix_hit = 1.5;
  ExpectRefused(f, "--prefix-hit");
  f = Small(), f.prefix_hit = std::nan("");
  ExpectRefused(f, "--prefix-hit");
  f = Small(), f.decode_dp = 0;
  ExpectRefused(f, "--decode-dp");
  f = Small(), f.prefill = 64, f.prefill_dp = 64;
  ExpectRefused(f, "workers, over");
  f = Small(), f.layers = 5000;
  ExpectRefused(f, "--layers");
  f = Small(), f.compute = "fpga";
  ExpectRefused(f, "--compute must be");
  f = Small(), f.compute = "gpu";
  ExpectRefused(f, "--compute gpu");
  f = Small(), f.transport = "cuda_ipc";
  ExpectRefused(f, "--transport cuda_ipc");
  f = Small(), f.blocks = 1;
  ExpectRefused(f, "--blocks");
  f = Small(), f.trace = "/nonexistent/trace";
  ExpectRefused(f, "--trace");
  f = Small(), f.model = "tiny-mla", f.layout = "blocks_first";
  ExpectRefused(f, "--layout");
}

TEST(Configure, PrefixHitsAreWholeBlocksOfBothSides) {
  PdFlags f = Small();
  f.block_tokens = 16, f.decode_block_tokens = 24;  // lcm 48
  f.prefix_hit = 0.5;
  PdConfig c = Configure(f).value();
  EXPECT_EQ(c.PrefixHitTokens(100), 48u);  // 50 -> 48
  EXPECT_EQ(c.PrefixHitTokens(95), 0u);    // 47 -> 0
  c.prefix_hit = 1;
  EXPECT_EQ(c.PrefixHitTokens(96), 96u);  // a full hit
  EXPECT_EQ(c.PrefixHitTokens(97), 96u);
  c.prefix_hit = 0;
  EXPECT_EQ(c.PrefixHitTokens(96), 0u);
}

TEST(WorkerConfig, RoundTripsAndRefusesBadInput) {
  PdConfig c = Configure(Small()).value();
  WorkerConfig w = MakeWorkerConfig(c, false, 1, 0, 0);
  EXPECT_EQ(w.instance, "d1");
  WorkerConfig back = WorkerConfig::FromJson(w.ToJson()).value();
  EXPECT_EQ(back.instance, "d1");
  EXPECT_FALSE(back.prefill);
  EXPECT_EQ(back.blocks, w.blocks);
  EXPECT_EQ(back.transfer_timeout_ms, 10000u);
  EXPECT_FALSE(back.gpu_compute);
  EXPECT_EQ(back.layers, 4u);
  EXPECT_FALSE(back.busy_poll);
  PdFlags busy = Small();
  busy.busy_poll = true;
  EXPECT_TRUE(WorkerConfig::FromJson(MakeWorkerConfig(Configure(busy).value(), true, 0, 0, 0).ToJson())->busy_poll);
  PdFlags f = Small();
  f.decode_dp = 3;
  c = Configure(f).value();
  EXPECT_EQ(WorkerConfig::FromJson(MakeWorkerConfig(c, false, 0, 2, 0).ToJson())->dp_rank, 2u);
  EXPECT_EQ(WorkerConfig::FromJson("not json").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(WorkerConfig::FromJson("{}").status().code(), Code::kInvalidArgument);
  std::string bad = w.ToJson();
  bad.replace(bad.find("\"tp_rank\":0"), 11, "\"tp_rank\":9");
  EXPECT_EQ(WorkerConfig::FromJson(bad).status().code(), Code::kInvalidArgument);
}

TEST(Arrivals, PoissonIsSeededAndAtTheRate) {
  auto a = PoissonArrivals(2000, 100, {10, 20}, 3);
  EXPECT_EQ(a, PoissonArrivals(2000, 100, {10, 20}, 3));
  EXPECT_NE(a, PoissonArrivals(2000, 100, {10, 20}, 4));
  for (size_t i = 1; i < a.size(); ++i) EXPECT_GE(a[i].at_s, a[i - 1].at_s);
  for (const Arrival& x : a) EXPECT_TRUE(x.tokens >= 10 && x.tokens <= 20);
  // 2000 arrivals at 100/s take about 20 s (the mean of the gaps is 1/rate).
  EXPECT_NEAR(a.back().at_s, 20.0, 2.0);
  for (const Arrival& x : PoissonArrivals(5, 0, {7, 7}, 1)) EXPECT_EQ(x, (Arrival{0, 7}));
}

TEST(Arrivals, ParsesTokenRanges) {
  EXPECT_EQ(ParseTokenRange("128").value().min, 128u);
  EXPECT_EQ(ParseTokenRange("128").value().max, 128u);
  EXPECT_EQ(ParseTokenRange("1..9").value().max, 9u);
  for (const char* bad : {"", "0", "9..1", "1..", "x", "1..99999999", "-3"})
    EXPECT_EQ(ParseTokenRange(bad).status().code(), Code::kInvalidArgument) << bad;
}

TEST(Arrivals, ParsesTraces) {
  auto t = ParseTrace("# prompt lengths\n100\n\n200\r\n", 0, 1).value();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0], (Arrival{0, 100}));
  EXPECT_EQ(t[1], (Arrival{0, 200}));
  t = ParseTrace("0.5 30\n0.1 10\n", 0, 1).value();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0], (Arrival{0.1, 10}));  // sorted by time
  EXPECT_EQ(t[1], (Arrival{0.5, 30}));
  EXPECT_GT(ParseTrace("5\n5\n", 10, 1).value()[1].at_s, 0);  // times from the rate
  for (const char* bad : {"", "# nothing\n", "abc\n", "0\n", "5\n0.1 5\n", "-1 5\n", "nan 5\n",
                          "1 2 3\n", "99999999\n"}) {
    Status s = ParseTrace(bad, 0, 1).status();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--trace"), std::string_view::npos) << s.ToString();
  }
  EXPECT_NE(ParseTrace("5\nx\n", 0, 1).status().message().find("line 2"), std::string_view::npos);
}

TEST(Configure, ReadsATraceFile) {
  const std::string path = ::testing::TempDir() + "/pd_trace.txt";
  std::ofstream(path) << "0 16\n0.01 33\n";
  PdFlags f = Small();
  f.trace = path;
  PdConfig c = Configure(f).value();
  ASSERT_EQ(c.arrivals.size(), 2u);
  EXPECT_EQ(c.arrivals[1].tokens, 33u);
}

}  // namespace
}  // namespace ferry::tools::pd
