// The UVA kernel's per-token logic (uva_device.h), run on the host: its row ids must equal
// ComputeRowIds', and unsound inputs must never make it read outside them (run under ASan).
#include "cuda/uva_device.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "embed/row_ids.h"
#include "embed/uva.h"

namespace ferry::embed {
namespace {

using cuda::kUvaMaxNgram;
using cuda::UvaHead;
using cuda::UvaStepArgs;
namespace uva = cuda::uva;

struct Step {
  std::vector<int32_t> tokens, qsl, ctx;
};

// The kernel's loop over tokens and heads, one thread: ids, kNoRow for padding and bad ids.
std::vector<uint64_t> EmulatedIds(const Layout& l, const Table& table, const Step& s,
                                  bool* bad_id) {
  std::vector<UvaHead> heads = UvaHeads(l);
  UvaStepArgs a = UvaBaseArgs(l, table, heads.data(), nullptr);
  a.tokens = s.tokens.data();
  a.query_start = s.qsl.data();
  a.context = s.ctx.data();
  a.num_tokens = static_cast<int64_t>(s.tokens.size());
  a.num_reqs = static_cast<int64_t>(s.qsl.size()) - 1;
  std::vector<uint64_t> ids(s.tokens.size() * l.num_heads(), uva::kNoRow);
  *bad_id = false;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    int64_t r = 0, i = 0;
    if (!uva::FindToken(a, t, &r, &i)) continue;
    if (!uva::IdsInVocabulary(a, t, r, i)) {
      *bad_id = true;
      continue;
    }
    for (int h = 0; h < a.num_heads; ++h) ids[t * a.num_heads + h] = uva::RowId(a, t, r, i, h);
  }
  return ids;
}

Layout MakeLayout(int n, int h, uint32_t seed) {
  Config c;
  c.vocab_size = 1 + seed % 5000;
  c.eos_id = seed % c.vocab_size;
  c.ngram_size = n;
  c.heads_per_ngram = h;
  c.embed_dim = 16 * (n - 1) * h;
  c.base_vocab = 1 + seed % 997;
  c.row_padding = 1 + seed % 64;
  c.seed = seed * 7919ull;
  c.layer = static_cast<int>(seed % 3);
  return Layout::Create(c).value();
}

TEST(UvaDevice, IdsMatchCpu) {
  std::mt19937 rng(17);
  for (int n = 2; n <= kUvaMaxNgram; n += (n < 5 ? 1 : 5)) {
    for (int h : {1, 2, 5}) {
      Layout l = MakeLayout(n, h, rng());
      auto table = Table::Synthetic(l, Dtype::kF8E4M3).value();
      const int64_t v = l.config().vocab_size;
      for (int trial = 0; trial < 10; ++trial) {
        Step s;
        const int reqs = rng() % 7;
        s.qsl.push_back(0);
        for (int r = 0; r < reqs; ++r) s.qsl.push_back(s.qsl.back() + rng() % 9);
        auto id = [&] {
          uint32_t k = rng() % 6;
          return k == 0   ? static_cast<int32_t>(l.config().eos_id)
                 : k == 1 ? -3
                          : static_cast<int32_t>(rng() % v);
        };
        for (int t = 0; t < s.qsl.back(); ++t) s.tokens.push_back(id());
        for (int t = 0; t < static_cast<int>(rng() % 4); ++t)
          s.tokens.push_back(static_cast<int32_t>(rng()));
        for (int k = 0; k < reqs * (n - 1); ++k) s.ctx.push_back(id());
        std::vector<uint64_t> cpu(s.tokens.size() * l.num_heads());
        ASSERT_TRUE(ComputeRowIds(l, StepInput{s.tokens, s.qsl, s.ctx}, cpu).ok());
        bool bad = false;
        EXPECT_EQ(EmulatedIds(l, *table, s, &bad), cpu) << "n=" << n << " h=" << h;
        EXPECT_FALSE(bad);
      }
    }
  }
}

TEST(UvaDevice, BadInputsStayInBounds) {
  Layout l = MakeLayout(3, 2, 5);
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  std::mt19937 rng(23);
  for (int trial = 0; trial < 2000; ++trial) {
    Step s;
    const int reqs = rng() % 5;
    for (int r = 0; r <= reqs; ++r) s.qsl.push_back(static_cast<int32_t>(rng() % 13) - 4);
    s.tokens.resize(rng() % 10);
    for (auto& t : s.tokens) t = static_cast<int32_t>(rng() % 12000) - 10;
    s.ctx.resize(reqs * 2);
    for (auto& t : s.ctx) t = static_cast<int32_t>(rng() % 12000) - 10;
    bool bad = false;
    std::vector<uint64_t> ids = EmulatedIds(l, *table, s, &bad);
    for (uint64_t id : ids) ASSERT_TRUE(id == uva::kNoRow || id < l.used_rows());
  }
  // An id >= V inside a request is reported.
  Step s{{1, 6000, 2}, {0, 3}, {0, 0}};
  bool bad = false;
  (void)EmulatedIds(l, *table, s, &bad);
  EXPECT_TRUE(bad);
}

}  // namespace
}  // namespace ferry::embed
