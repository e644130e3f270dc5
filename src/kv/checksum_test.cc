// The per-layer checksum over host memory: its definition (a known sum of word terms, the
// tail of a slice that is not a multiple of 8 bytes), its mixing (swapped words, heads, tokens
// or K and V and zeroed blocks change it), its independence of layout (other TP size, block
// size, kernel block, tensor order, MLA), and the Checksummer's checks of what it is asked.
#include "kv/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/layer_hash.h"

namespace ferry::kv {
namespace {

CacheLayout Identity(uint32_t tp_rank, uint32_t tp_size, uint32_t block_tokens, uint32_t heads = 4,
                     uint32_t head_dim = 8, bool mla = false) {
  CacheLayout l;
  l.model = "checksum-test";
  l.dtype_bytes = 2;
  l.head_dim = head_dim;
  l.total_kv_heads = mla ? 1 : heads;
  l.mla = mla;
  l.num_layers = 2;
  l.tp_rank = tp_rank;
  l.tp_size = tp_size;
  l.block_tokens = block_tokens;
  l.num_blocks = 16;
  return l;
}

// A cache in host memory and its addressing.
struct Cache {
  CacheLayout layout;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<const std::byte*> bases;
  std::vector<MemoryDesc> regions;

  static Cache Make(CacheLayout identity, TensorOrder order) {
    Cache c;
    auto l = MakeLayout(identity, order);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    c.layout = *l;
    for (uint64_t bytes : c.layout.region_bytes) c.buffers.emplace_back(bytes, std::byte{0xee});
    for (auto& b : c.buffers) {
      c.bases.push_back(b.data());
      MemoryDesc d;
      d.address = reinterpret_cast<uint64_t>(b.data());
      d.size = b.size();
      c.regions.push_back(d);
    }
    return c;
  }
  HeadRange held() const { return HeadsOf(layout.total_kv_heads, layout.mla, layout.tp_size, layout.tp_rank); }
  std::byte* At(const std::vector<uint64_t>& blocks, uint64_t token, uint32_t head, int kv, uint32_t layer) {
    const TensorLayout& t = kv ? *layout.layers[layer].v : layout.layers[layer].k;
    const uint64_t kb = layout.kernel_block();
    const uint64_t in = token % layout.block_tokens;
    const uint64_t kblock = blocks[token / layout.block_tokens] * (layout.block_tokens / kb) + in / kb;
    const uint64_t local = layout.mla ? 0 : head - layout.first_head();
    return buffers[t.region].data() + t.offset + kblock * t.block_stride + (in % kb) * t.token_stride +
           local * t.head_stride;
  }
  // Byte i of (token, head, kv) of `layer` is a function of those alone (the logical content).
  void Fill(const std::vector<uint64_t>& blocks, uint64_t tokens, uint32_t layer) {
    const HeadRange h = held();
    for (uint64_t t = 0; t < tokens; ++t) {
      for (uint32_t head = h.begin; head < h.end; ++head) {
        for (int kv = 0; kv < (layout.mla ? 1 : 2); ++kv) {
          std::byte* p = At(blocks, t, head, kv, layer);
          for (uint64_t i = 0; i < layout.head_bytes(); ++i) {
            p[i] = static_cast<std::byte>((t * 131 + head * 31 + kv * 17 + i * 7 + layer * 3 + (t >> 3) * 5) & 0xff);
          }
        }
      }
    }
  }
  uint64_t Sum(const std::vector<uint64_t>& blocks, uint64_t tokens, uint32_t layer, HeadRange heads) const {
    return LayerChecksum(layout, bases, blocks, tokens, heads, layer);
  }
  uint64_t Sum(const std::vector<uint64_t>& blocks, uint64_t tokens, uint32_t layer) const {
    return Sum(blocks, tokens, layer, held());
  }
};

TEST(LayerChecksumTest, IsTheSumOfKeyedWordTermsAndPadsATail) {
  // One token, one head of 3 fp16 elements (6 bytes: a tail of 6), K and V, MLA off.
  Cache c = Cache::Make(Identity(0, 1, 4, /*heads=*/1, /*head_dim=*/3), TensorOrder::kKvFirst);
  const std::vector<uint64_t> blocks{2};
  const uint8_t k[6] = {1, 2, 3, 4, 5, 6}, v[6] = {0xff, 0, 0x10, 0x20, 0x30, 0x40};
  std::memcpy(c.At(blocks, 0, 0, 0, 1), k, 6);
  std::memcpy(c.At(blocks, 0, 0, 1, 1), v, 6);
  const uint64_t seed = cuda::LayerHashSeed(1);
  // K is slice 0, V slice 1, one word each; the word is little-endian, zero-padded.
  const uint64_t want = cuda::LayerHashTerm(seed, 0x060504030201ULL) +
                        cuda::LayerHashTerm(seed + cuda::kLayerHashStep, 0x4030201000ffULL);
  EXPECT_EQ(c.Sum(blocks, 1, 1), want);
}

TEST(LayerChecksumTest, SwappedWordsHeadsTokensAndKvAndAZeroedBlockChangeIt) {
  Cache c = Cache::Make(Identity(0, 1, 8, 4, 16), TensorOrder::kBlocksFirst);
  const std::vector<uint64_t> blocks{5, 1, 9};
  const uint64_t tokens = 20;
  c.Fill(blocks, tokens, 0);
  const uint64_t base = c.Sum(blocks, tokens, 0);
  EXPECT_EQ(c.Sum(blocks, tokens, 0), base);    // a function of the bytes
  EXPECT_NE(c.Sum(blocks, tokens, 1), base);    // keyed by the layer: the same bytes in layer 1
  EXPECT_NE(c.Sum(blocks, tokens - 1, 0), base);
  const uint64_t hb = c.layout.head_bytes();
  auto swap_and_check = [&](std::byte* a, std::byte* b, uint64_t n, const char* what) {
    std::swap_ranges(a, a + n, b);
    EXPECT_NE(c.Sum(blocks, tokens, 0), base) << what;
    std::swap_ranges(a, a + n, b);
    EXPECT_EQ(c.Sum(blocks, tokens, 0), base) << what;
  };
  std::byte* p = c.At(blocks, 3, 1, 0, 0);
  swap_and_check(p, p + 8, 8, "two words of a slice");
  swap_and_check(c.At(blocks, 3, 1, 0, 0), c.At(blocks, 3, 2, 0, 0), hb, "two heads of a token");
  swap_and_check(c.At(blocks, 3, 1, 1, 0), c.At(blocks, 12, 1, 1, 0), hb, "two tokens of a head");
  swap_and_check(c.At(blocks, 7, 0, 0, 0), c.At(blocks, 7, 0, 1, 0), hb, "K and V");
  // The whole of the second block's tokens (8..15) zeroed, in every head, K and V.
  std::vector<std::vector<std::byte>> saved = c.buffers;
  for (uint64_t t = 8; t < 16; ++t) {
    for (uint32_t h = 0; h < 4; ++h) {
      for (int kv = 0; kv < 2; ++kv) std::memset(c.At(blocks, t, h, kv, 0), 0, hb);
    }
  }
  EXPECT_NE(c.Sum(blocks, tokens, 0), base) << "a zeroed block";
  c.buffers = saved;
  c.bases.clear();
  for (auto& b : c.buffers) c.bases.push_back(b.data());
  EXPECT_EQ(c.Sum(blocks, tokens, 0), base);
  // One flipped bit of the last token's last byte.
  *(c.At(blocks, tokens - 1, 3, 1, 0) + hb - 1) ^= std::byte{0x80};
  EXPECT_NE(c.Sum(blocks, tokens, 0), base);
}

// The producer's checksum over the heads it sends to a consumer rank equals that rank's over
// its own layout and blocks, for the same logical content.
void ExpectSameAcrossLayouts(CacheLayout src_id, TensorOrder src_order, CacheLayout dst_id, TensorOrder dst_order,
                             uint64_t tokens) {
  Cache src = Cache::Make(src_id, src_order);
  Cache dst = Cache::Make(dst_id, dst_order);
  std::vector<uint64_t> sb, db;
  for (uint64_t i = 0; i * src.layout.block_tokens < tokens; ++i) sb.push_back((i * 5 + 3) % src.layout.num_blocks);
  for (uint64_t i = 0; i * dst.layout.block_tokens < tokens; ++i) db.push_back((i * 7 + 2) % dst.layout.num_blocks);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    src.Fill(sb, tokens, layer);
    dst.Fill(db, tokens, layer);
    const HeadRange heads = RouteHeads(TpPair{src.layout.total_kv_heads, src.layout.mla, src.layout.tp_size,
                                              dst.layout.tp_size},
                                       src.layout.tp_rank, dst.layout.tp_rank);
    ASSERT_FALSE(heads.empty());
    EXPECT_EQ(src.Sum(sb, tokens, layer, heads), dst.Sum(db, tokens, layer, heads))
        << "layer " << layer << " heads [" << heads.begin << ", " << heads.end << ")";
  }
}

TEST(LayerChecksumTest, IsTheSameOverEveryLayoutOfTheSameContent) {
  // TP 1 (4 heads, blocks of 16, KV-first) to TP 2 rank 1 (heads 2, 3; blocks of 8, HND).
  ExpectSameAcrossLayouts(Identity(0, 1, 16), TensorOrder::kKvFirst, Identity(1, 2, 8), TensorOrder::kKvFirstHnd, 37);
  // TP 2 rank 0 to TP 4 rank 1 (head 1), separate K and V tensors on the consumer.
  ExpectSameAcrossLayouts(Identity(0, 2, 8), TensorOrder::kBlocksFirstHnd, Identity(1, 4, 32), TensorOrder::kSeparate,
                          50);
  // Replicated heads: TP 8 over 4 heads (rank 5 holds head 2) from TP 1.
  ExpectSameAcrossLayouts(Identity(0, 1, 16), TensorOrder::kSeparateHnd, Identity(5, 8, 16), TensorOrder::kBlocksFirst,
                          16);
  // A kernel block smaller than the scheduler's.
  CacheLayout kernel = Identity(0, 1, 32);
  kernel.kernel_block_tokens = 8;
  ExpectSameAcrossLayouts(Identity(0, 1, 16), TensorOrder::kKvFirst, kernel, TensorOrder::kKvFirstHnd, 45);
  // Heads of 6 bytes (a tail in every slice) and of 10.
  ExpectSameAcrossLayouts(Identity(0, 1, 16, 4, 3), TensorOrder::kKvFirst, Identity(1, 2, 8, 4, 3),
                          TensorOrder::kKvFirstHnd, 21);
  ExpectSameAcrossLayouts(Identity(1, 2, 4, 2, 5), TensorOrder::kBlocksFirst, Identity(0, 1, 16, 2, 5),
                          TensorOrder::kSeparateHnd, 30);
  // MLA (one latent), TP 1 to TP 2.
  ExpectSameAcrossLayouts(Identity(0, 1, 16, 1, 12, true), TensorOrder::kMla, Identity(1, 2, 8, 1, 12, true),
                          TensorOrder::kMla, 40);
}

TEST(ChecksummerTest, HostLayersAreComputedAtStartAndMatchLayerChecksum) {
  Cache c = Cache::Make(Identity(1, 2, 8), TensorOrder::kKvFirst);
  const std::vector<uint64_t> blocks{4, 0, 7};
  c.Fill(blocks, 24, 0);
  c.Fill(blocks, 24, 1);
  auto s = Checksummer::Create(c.layout, c.regions);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE((*s)->on_gpu(0));
  std::vector<PendingChecksum> jobs(2);
  auto job = (*s)->Start(blocks, 24, c.held(), 1);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  jobs[1] = *job;
  std::vector<uint64_t> sums;
  ASSERT_TRUE((*s)->FinishAll(jobs, Deadline::After(std::chrono::seconds(1)), &sums).ok());
  EXPECT_EQ(sums, (std::vector<uint64_t>{0, c.Sum(blocks, 24, 1)}));  // 0: layer 0 not started
  // Nothing to hash (no tokens, no heads) is 1, never 0 ("not written").
  auto none = (*s)->Start(blocks, 0, c.held(), 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*(*s)->Finish(*none, Deadline()), 1u);
  PendingChecksum never;
  EXPECT_EQ((*s)->Finish(never, Deadline()).status().code(), Code::kFailedPrecondition);
}

TEST(ChecksummerTest, RefusesWhatThisSideCannotHold) {
  Cache c = Cache::Make(Identity(1, 2, 8), TensorOrder::kKvFirst);  // heads 2, 3; 16 blocks of 8
  auto s = Checksummer::Create(c.layout, c.regions);
  ASSERT_TRUE(s.ok());
  const std::vector<uint64_t> blocks{4, 0};
  EXPECT_EQ((*s)->Start(blocks, 16, c.held(), 2).status().code(), Code::kOutOfRange);     // layer
  EXPECT_EQ((*s)->Start(blocks, 17, c.held(), 0).status().code(), Code::kOutOfRange);     // tokens
  EXPECT_EQ((*s)->Start(std::vector<uint64_t>{4, 16}, 9, c.held(), 0).status().code(), Code::kOutOfRange);   // block id
  EXPECT_EQ((*s)->Start(blocks, 16, HeadRange{1, 3}, 0).status().code(), Code::kOutOfRange);  // head 1
  EXPECT_EQ((*s)->Start(blocks, 16, HeadRange{2, 5}, 0).status().code(), Code::kOutOfRange);
  // A block past the tokens is not read, so not checked.
  EXPECT_TRUE((*s)->Start(std::vector<uint64_t>{4, 99}, 8, HeadRange{2, 3}, 0).ok());
}

TEST(ChecksummerTest, RefusesLayersSplitOverMemoryKindsOrGpus) {
  Cache c = Cache::Make(Identity(0, 1, 8), TensorOrder::kSeparate);  // K and V regions per layer
  ASSERT_EQ(c.regions.size(), 4u);
  std::vector<MemoryDesc> mixed = c.regions;
  mixed[c.layout.layers[0].v->region].kind = MemoryKind::kCuda;
  mixed[c.layout.layers[0].v->region].device = 0;
  EXPECT_EQ(Checksummer::Create(c.layout, mixed).status().code(), Code::kUnsupported);
  std::vector<MemoryDesc> two_gpus = c.regions;
  for (size_t i = 0; i < two_gpus.size(); ++i) {
    two_gpus[i].kind = MemoryKind::kCuda;
    two_gpus[i].device = i < 2 ? 0 : 1;
  }
  EXPECT_EQ(Checksummer::Create(c.layout, two_gpus).status().code(), Code::kUnsupported);
  std::vector<MemoryDesc> few(c.regions.begin(), c.regions.begin() + 2);
  EXPECT_EQ(Checksummer::Create(c.layout, few).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::kv
