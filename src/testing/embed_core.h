// Helpers of the embedding tests: small table configurations given by head dim, a step's
// inputs, owned, and random steps with EOS, negative and padding ids in them.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ferry/embed.h"

namespace ferry::embed::testing {

// A test table's shape: V, EOS, N, H and the head dim d (E = d (N - 1) H), B and P.
struct TableShape {
  int64_t vocab = 0;
  int64_t eos = 0;
  int ngram = 0;
  int heads = 0;
  int64_t head_dim = 0;
  uint64_t base = 0;
  uint64_t padding = 0;
};

// The configuration of that shape; the seed and the layer are Config's defaults.
inline Config ConfigOf(const TableShape& s) {
  Config c;
  c.vocab_size = s.vocab;
  c.eos_id = s.eos;
  c.ngram_size = s.ngram;
  c.heads_per_ngram = s.heads;
  c.embed_dim = s.head_dim * (s.ngram - 1) * s.heads;
  c.base_vocab = s.base;
  c.row_padding = s.padding;
  return c;
}

// A step's inputs, owned (StepInput views them).
struct Step {
  std::vector<int32_t> tokens, qsl, ctx;
  StepInput input() const { return StepInput{tokens, qsl, ctx}; }
};

// `reqs` requests of 0..max_len tokens each, then `padding` tokens past the last request (any
// int32: they are never read). Of the ids inside requests and of the N - 1 context ids each
// request brings, one in ten is EOS, one in ten negative (read as 0), the rest in [0, V).
inline Step RandomStep(const Layout& l, int reqs, int max_len, int padding, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t v = l.config().vocab_size;
  const int32_t eos = static_cast<int32_t>(l.config().eos_id);
  auto id = [&] {
    const uint32_t k = rng() % 10;
    const int32_t any = static_cast<int32_t>(rng() % v);
    return k == 0 ? eos : k == 1 ? -1 - any : any;
  };
  Step s;
  s.qsl.push_back(0);
  for (int r = 0; r < reqs; ++r) s.qsl.push_back(s.qsl.back() + rng() % (max_len + 1));
  for (int t = 0; t < s.qsl.back(); ++t) s.tokens.push_back(id());
  for (int t = 0; t < padding; ++t) s.tokens.push_back(static_cast<int32_t>(rng()));
  for (int i = 0; i < reqs * (l.ngram_size() - 1); ++i) s.ctx.push_back(id());
  return s;
}

}  // namespace ferry::embed::testing
