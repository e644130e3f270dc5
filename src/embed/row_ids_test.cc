#include "embed/row_ids.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ferry::embed {
namespace {

// The specification read literally, one token at a time: x = context ++ tokens, seg(p) from a
// backwards search for EOS, y_s[p] by its definition.
std::vector<uint64_t> Naive(const Layout& layout, const std::vector<int32_t>& tokens,
                            const std::vector<int32_t>& qsl, const std::vector<int32_t>& ctx) {
  const int n = layout.ngram_size(), g = layout.num_heads(),
            h_per = layout.config().heads_per_ngram;
  const int64_t eos = layout.config().eos_id;
  std::vector<uint64_t> out(tokens.size() * g, kPaddingRow);
  for (size_t r = 0; r + 1 < qsl.size(); ++r) {
    std::vector<int64_t> x;
    for (int i = 0; i < n - 1; ++i) x.push_back(std::max(0, ctx[r * (n - 1) + i]));
    for (int t = qsl[r]; t < qsl[r + 1]; ++t) x.push_back(std::max(0, tokens[t]));
    for (int t = qsl[r]; t < qsl[r + 1]; ++t) {
      const int64_t p = n - 1 + (t - qsl[r]);
      int64_t q = -1;
      for (int64_t i = p - 1; i >= 0; --i)
        if (x[i] == eos) {
          q = i;
          break;
        }
      const int64_t seg = p - q - 1;
      for (int nn = 2; nn <= n; ++nn) {
        uint64_t mix = 0;
        for (int s = 0; s < nn; ++s) {
          uint64_t y = (p - s >= 0 && seg >= s) ? x[p - s] : eos;
          mix ^= y * layout.multipliers()[s];
        }
        for (int h = (nn - 2) * h_per; h < (nn - 1) * h_per; ++h)
          out[t * g + h] = mix % layout.head_sizes()[h] + layout.head_offsets()[h];
      }
    }
  }
  return out;
}

Config Small(int n, int h) {
  Config c;
  c.vocab_size = 1000;
  c.eos_id = 2;
  c.ngram_size = n;
  c.heads_per_ngram = h;
  c.embed_dim = 16 * (n - 1) * h;
  c.base_vocab = 50;
  c.row_padding = 8;
  return c;
}

std::vector<uint64_t> Ids(const Layout& layout, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& qsl, const std::vector<int32_t>& ctx,
                          ThreadPool* pool = nullptr) {
  std::vector<uint64_t> out(tokens.size() * layout.num_heads(), 0);
  StepInput in{tokens, qsl, ctx};
  Status s = ComputeRowIds(layout, in, out, pool);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(RowIds, HandExampleBigram) {
  // N = 2, H = 1: one head, mix = x[p] m0 ^ y1[p] m1.
  auto layout = Layout::Create(Small(2, 1)).value();
  const uint64_t m0 = layout.multipliers()[0], m1 = layout.multipliers()[1];
  const uint64_t size = layout.head_sizes()[0];  // 53, the first prime >= 50
  ASSERT_EQ(size, 53u);
  // One request: context [7], tokens [5, 2(EOS), 9].
  std::vector<uint64_t> got = Ids(layout, {5, 2, 9}, {0, 3}, {7});
  EXPECT_EQ(got[0], (5 * m0 ^ 7 * m1) % size);
  EXPECT_EQ(got[1], (2 * m0 ^ 5 * m1) % size);  // EOS hashes with the token before it
  EXPECT_EQ(got[2], (9 * m0 ^ 2 * m1) % size);  // after EOS: y1 = EOS (= the EOS token)
}

TEST(RowIds, EosBlocksOlderTokens) {
  auto layout = Layout::Create(Small(3, 1)).value();
  const auto& m = layout.multipliers();
  const uint64_t s1 = layout.head_sizes()[1], off1 = layout.head_offsets()[1];
  // Context [4, 2(EOS)], tokens [6, 8]: for token 6, y1 = EOS, y2 = EOS (not 4);
  // for token 8, y1 = 6, y2 = EOS.
  std::vector<uint64_t> got = Ids(layout, {6, 8}, {0, 2}, {4, 2});
  EXPECT_EQ(got[0 * 2 + 1], (6 * m[0] ^ 2 * m[1] ^ 2 * m[2]) % s1 + off1);
  EXPECT_EQ(got[1 * 2 + 1], (8 * m[0] ^ 6 * m[1] ^ 2 * m[2]) % s1 + off1);
}

TEST(RowIds, NegativeIdsReadAsZeroAndPaddingRows) {
  auto layout = Layout::Create(Small(3, 2)).value();
  auto a = Ids(layout, {-1, 5, -7, 99}, {0, 3}, {-3, 0});
  auto b = Ids(layout, {0, 5, 0, 123}, {0, 3}, {0, 0});
  for (int i = 0; i < 3 * 4; ++i) EXPECT_EQ(a[i], b[i]) << i;
  for (int i = 12; i < 16; ++i) EXPECT_EQ(a[i], kPaddingRow);  // token 3 is padding
}

TEST(RowIds, MatchesLiteralSpecification) {
  std::mt19937 rng(42);
  for (int n = 2; n <= 5; ++n) {
    for (int h : {1, 3}) {
      auto layout = Layout::Create(Small(n, h)).value();
      for (int trial = 0; trial < 20; ++trial) {
        const int reqs = rng() % 6;
        std::vector<int32_t> qsl{0};
        for (int r = 0; r < reqs; ++r) qsl.push_back(qsl.back() + rng() % 7);  // empty allowed
        std::vector<int32_t> tokens(qsl.back() + rng() % 3);
        // Small ids so EOS (2) and 0 are frequent; some negatives.
        for (auto& t : tokens) t = static_cast<int32_t>(rng() % 8) - 2;
        std::vector<int32_t> ctx(reqs * (n - 1));
        for (auto& t : ctx) t = static_cast<int32_t>(rng() % 8) - 2;
        EXPECT_EQ(Ids(layout, tokens, qsl, ctx), Naive(layout, tokens, qsl, ctx))
            << "n=" << n << " h=" << h << " trial " << trial;
      }
    }
  }
}

TEST(RowIds, ParallelMatchesSerial) {
  auto layout = Layout::Create(Config::Model(1)).value();
  std::mt19937 rng(3);
  std::vector<int32_t> qsl{0};
  for (int r = 0; r < 7; ++r) qsl.push_back(qsl.back() + 1 + rng() % 2000);
  std::vector<int32_t> tokens(qsl.back() + 5);
  for (auto& t : tokens) t = rng() % 248320;
  std::vector<int32_t> ctx(7 * 2, 1);
  ThreadPool pool(3, "ids-test");
  ASSERT_GE(tokens.size(), static_cast<size_t>(kParallelTokens));
  auto serial = Ids(layout, tokens, qsl, ctx);
  auto parallel = Ids(layout, tokens, qsl, ctx, &pool);
  EXPECT_EQ(serial, parallel);
  EXPECT_EQ(serial, Naive(layout, tokens, qsl, ctx));
}

TEST(RowIds, ValidationErrors) {
  auto layout = Layout::Create(Small(3, 1)).value();
  std::vector<int32_t> tokens{1, 2, 3, 4};
  auto code = [&](std::vector<int32_t> tok, std::vector<int32_t> qsl, std::vector<int32_t> ctx,
                  size_t out_size = 0) {
    std::vector<uint64_t> o(out_size ? out_size : tok.size() * 2, 77);
    Status s = ComputeRowIds(layout, StepInput{tok, qsl, ctx}, o);
    if (!s.ok()) {
      for (uint64_t v : o) EXPECT_EQ(v, 77u) << "written on error";
    }
    return s.code();
  };
  EXPECT_EQ(code(tokens, {0, 2, 4}, {0, 0, 0, 0}), Code::kOk);
  EXPECT_EQ(code(tokens, {}, {}), Code::kInvalidArgument);                   // no query starts
  EXPECT_EQ(code(tokens, {1, 4}, {0, 0}), Code::kInvalidArgument);           // first != 0
  EXPECT_EQ(code(tokens, {0, 3, 2}, {0, 0, 0, 0}), Code::kInvalidArgument);  // decreasing
  EXPECT_EQ(code(tokens, {0, -1}, {0, 0}), Code::kInvalidArgument);          // negative
  EXPECT_EQ(code(tokens, {0, 5}, {0, 0}), Code::kOutOfRange);                // past num_tokens
  EXPECT_EQ(code(tokens, {0, 4}, {0}), Code::kInvalidArgument);              // context size
  EXPECT_EQ(code(tokens, {0, 4}, {0, 0}, 7), Code::kInvalidArgument);        // output size
  EXPECT_EQ(code({1, 1000, 3, 4}, {0, 4}, {0, 0}), Code::kOutOfRange);       // id == V
  EXPECT_EQ(code({1, 2, 3, 4}, {0, 4}, {0, 1000}), Code::kOutOfRange);       // context id == V
  // A bad id in padding is never read.
  EXPECT_EQ(code({1, 2, 3, 5000}, {0, 3}, {0, 0}), Code::kOk);
}

}  // namespace
}  // namespace ferry::embed
