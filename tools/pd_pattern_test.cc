#include "pd_pattern.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "pd_config.h"

namespace ferry::tools::pd {
namespace {

// A layout by hand (the connector's MakeLayout is not under test here): one region per layer,
// K then V, [2, N, bs, H, D] (NHD) or [2, N, H, bs, D] (HND).
kv::CacheLayout Layout(uint32_t tp_size, uint32_t tp_rank, uint32_t block_tokens, uint64_t blocks,
                       bool hnd) {
  kv::CacheLayout l;
  l.model = "test";
  l.dtype_bytes = 2;
  l.head_dim = 4;
  l.total_kv_heads = 4;
  l.num_layers = 3;
  l.tp_size = tp_size;
  l.tp_rank = tp_rank;
  l.block_tokens = block_tokens;
  l.num_blocks = blocks;
  const uint64_t hb = 8, heads = 4 / tp_size;
  kv::TensorLayout t;
  t.block_stride = block_tokens * heads * hb;
  t.token_stride = hnd ? hb : heads * hb;
  t.head_stride = hnd ? block_tokens * hb : hb;
  for (uint32_t i = 0; i < l.num_layers; ++i) {
    kv::LayerLayout layer;
    layer.k = t;
    layer.k.region = i;
    layer.v = t;
    layer.v->region = i;
    layer.v->offset = blocks * t.block_stride;
    l.layers.push_back(layer);
    l.region_bytes.push_back(2 * blocks * t.block_stride);
  }
  return l;
}

struct Cache {
  kv::CacheLayout layout;
  std::vector<std::vector<std::byte>> memory;
  CacheView view;
  explicit Cache(kv::CacheLayout l) : layout(std::move(l)) {
    view.layout = &layout;
    for (uint64_t bytes : layout.region_bytes) memory.emplace_back(bytes, std::byte{0});
    for (auto& m : memory) view.regions.push_back(m.data());
    HeadSlice h = HeadsOf(layout.total_kv_heads, false, layout.tp_size, layout.tp_rank);
    view.first_head = h.first;
    view.heads = h.count;
  }
};

// Copies what a connector would move: every token's vectors of the heads `dst` holds.
void Move(const Cache& src, std::span<const uint64_t> src_blocks, Cache& dst,
          std::span<const uint64_t> dst_blocks, uint64_t tokens) {
  for (uint32_t layer = 0; layer < 3; ++layer)
    for (int kv = 0; kv < 2; ++kv) {
      const kv::TensorLayout& s = kv ? *src.layout.layers[layer].v : src.layout.layers[layer].k;
      const kv::TensorLayout& d = kv ? *dst.layout.layers[layer].v : dst.layout.layers[layer].k;
      for (uint64_t t = 0; t < tokens; ++t)
        for (uint32_t h = 0; h < dst.view.heads; ++h) {
          const uint32_t model_head = dst.view.first_head + h;
          std::memcpy(dst.view.regions[d.region] + VectorOffset(dst.layout, d, dst_blocks, t, h),
                      src.view.regions[s.region] + VectorOffset(src.layout, s, src_blocks, t,
                                                                model_head - src.view.first_head),
                      8);
        }
    }
}

TEST(Pattern, DependsOnEveryCoordinate) {
  const VectorKey base{1, 2, 0, 3, 4};
  std::set<uint64_t> words{PatternWord(base, 0), PatternWord(base, 1)};
  for (VectorKey k : {VectorKey{2, 2, 0, 3, 4}, VectorKey{1, 3, 0, 3, 4}, VectorKey{1, 2, 1, 3, 4},
                      VectorKey{1, 2, 0, 4, 4}, VectorKey{1, 2, 0, 3, 5}})
    words.insert(PatternWord(k, 0));
  EXPECT_EQ(words.size(), 7u);
}

TEST(Pattern, FillsAndChecksVectorsOfAnyLength) {
  for (size_t bytes : {1, 6, 8, 13, 1152}) {
    std::vector<std::byte> v(bytes);
    const VectorKey key{9, 1, 1, 77, 3};
    FillVector(key, v);
    EXPECT_EQ(CheckVector(key, v), 0u);
    EXPECT_GT(CheckVector(VectorKey{10, 1, 1, 77, 3}, v), 0u) << bytes;
    v[bytes / 2] ^= std::byte{0x10};
    EXPECT_EQ(CheckVector(key, v), 1u);
  }
}

TEST(Pattern, VerifiesAcrossTpBlockSizesAndTensorOrders) {
  // Producer: TP 1, blocks of 4 tokens, NHD. Consumers: the two ranks of TP 2, blocks of 2, HND.
  Cache p(Layout(1, 0, 4, 16, false));
  const uint64_t tokens = 11;
  const std::vector<uint64_t> p_blocks = {9, 2, 14};
  for (uint32_t layer = 0; layer < 3; ++layer) FillLayer(p.view, 42, layer, p_blocks, tokens);
  EXPECT_EQ(CheckRequest(p.view, 42, p_blocks, tokens).bad_vectors, 0u);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    Cache d(Layout(2, rank, 2, 16, true));
    const std::vector<uint64_t> d_blocks = {3, 1, 15, 0, 7, 8};
    CheckReport empty = CheckRequest(d.view, 42, d_blocks, tokens);
    EXPECT_EQ(empty.bad_vectors, 3u * 2 * tokens * 2);  // nothing arrived yet
    Move(p, p_blocks, d, d_blocks, tokens);
    CheckReport r = CheckRequest(d.view, 42, d_blocks, tokens);
    EXPECT_EQ(r.bad_vectors, 0u) << r.first_bad;
    EXPECT_EQ(r.bytes_checked, 3u * 2 * tokens * 2 * 8);
    // Another request's data in the same blocks does not pass.
    EXPECT_EQ(CheckRequest(d.view, 43, d_blocks, tokens).bad_vectors, 3u * 2 * tokens * 2);
    // One flipped byte is found and located.
    const kv::TensorLayout& v = *d.layout.layers[2].v;
    d.view.regions[v.region][VectorOffset(d.layout, v, d_blocks, 5, 1) + 3] ^= std::byte{1};
    r = CheckRequest(d.view, 42, d_blocks, tokens);
    EXPECT_EQ(r.bad_vectors, 1u);
    EXPECT_EQ(r.bad_bytes, 1u);
    EXPECT_EQ(r.first_bad,
              "layer 2 V token 5 head " + std::to_string(rank * 2 + 1) + ": 1 of 8 bytes differ");
  }
}

// After a prefix hit the consumer's blocks hold the tokens from first_token on: the check
// covers those tokens only, each at its place counted from the first block given.
TEST(Pattern, ChecksOnlyTheTokensAfterAPrefixHit) {
  Cache p(Layout(1, 0, 4, 16, false));
  const uint64_t tokens = 11, first = 4;
  const std::vector<uint64_t> p_blocks = {9, 2, 14};
  for (uint32_t layer = 0; layer < 3; ++layer) FillLayer(p.view, 42, layer, p_blocks, tokens);
  Cache d(Layout(1, 0, 2, 16, true));
  const std::vector<uint64_t> d_blocks = {6, 0, 11, 3};  // tokens 4..11
  for (uint32_t layer = 0; layer < 3; ++layer)
    for (int kv = 0; kv < 2; ++kv) {
      const kv::TensorLayout& s = kv ? *p.layout.layers[layer].v : p.layout.layers[layer].k;
      const kv::TensorLayout& t = kv ? *d.layout.layers[layer].v : d.layout.layers[layer].k;
      for (uint64_t tok = first; tok < tokens; ++tok)
        for (uint32_t h = 0; h < 4; ++h)
          std::memcpy(
              d.view.regions[t.region] + VectorOffset(d.layout, t, d_blocks, tok - first, h),
              p.view.regions[s.region] + VectorOffset(p.layout, s, p_blocks, tok, h), 8);
    }
  CheckReport r = CheckRequest(d.view, 42, d_blocks, tokens, first);
  EXPECT_EQ(r.bad_vectors, 0u) << r.first_bad;
  EXPECT_EQ(r.bytes_checked, 3u * 2 * (tokens - first) * 4 * 8);
  // Read as if from token 0, the same bytes are the wrong tokens' content.
  EXPECT_GT(CheckRequest(d.view, 42, d_blocks, tokens - first).bad_vectors, 0u);
  // A full hit checks nothing.
  EXPECT_EQ(CheckRequest(d.view, 42, {}, tokens, tokens).bytes_checked, 0u);
}

TEST(Pattern, BlockRangeCoversEveryVectorOfTheBlock) {
  for (bool hnd : {false, true}) {
    kv::CacheLayout l = Layout(2, 0, 4, 8, hnd);
    const kv::TensorLayout& v = *l.layers[1].v;
    const ByteRange r = BlockRange(l, v, 2, 5);
    const std::vector<uint64_t> blocks = {5};
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t t = 0; t < 4; ++t)
      for (uint32_t h = 0; h < 2; ++h) {
        lo = std::min(lo, VectorOffset(l, v, blocks, t, h));
        hi = std::max(hi, VectorOffset(l, v, blocks, t, h) + 8);
      }
    EXPECT_EQ(r.begin, lo);
    EXPECT_EQ(r.end, hi);
    EXPECT_EQ(r.end - r.begin, v.block_stride);  // a standard layout's block is contiguous
  }
}

}  // namespace
}  // namespace ferry::tools::pd
