// CacheLayout geometry and MakeLayout (the standard tensor orders); the planner's head routes
// and partners; BuildPlan against the naive reference (planner_reference.h), merging, errors.
#include "kv/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/kv.h"
#include "kv/planner_reference.h"

namespace ferry::kv {
namespace {

CacheLayout Identity(uint32_t heads = 8, uint32_t tp = 1, uint32_t rank = 0, bool mla = false) {
  CacheLayout c;
  c.model = "m";
  c.dtype_bytes = 2;
  c.head_dim = 16;
  c.total_kv_heads = mla ? 1 : heads;
  c.mla = mla;
  c.num_layers = 3;
  c.tp_size = tp;
  c.tp_rank = rank;
  c.block_tokens = 16;
  c.num_blocks = 10;
  return c;
}

TEST(LayoutTest, HeadsAndFirstHead) {
  EXPECT_EQ(Identity(8, 4, 3).heads(), 2u);
  EXPECT_EQ(Identity(8, 4, 3).first_head(), 6u);
  EXPECT_EQ(Identity(2, 8, 5).heads(), 1u);  // replicated
  EXPECT_EQ(Identity(2, 8, 5).first_head(), 1u);
  EXPECT_EQ(Identity(1, 8, 5, true).heads(), 1u);
  EXPECT_EQ(Identity(1, 8, 5, true).first_head(), 0u);
}

TEST(LayoutTest, MakeLayoutStrides) {
  // N = 10 blocks * 2 kernel blocks, bs = 8, H = 2, hb = 32.
  CacheLayout id = Identity(8, 4, 1);
  id.kernel_block_tokens = 8;
  auto kv = MakeLayout(id, TensorOrder::kKvFirst);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  const uint64_t tensor = 20 * 8 * 2 * 32;
  EXPECT_EQ(kv->region_bytes, std::vector<uint64_t>(3, 2 * tensor));
  EXPECT_EQ(kv->layers[2].k, (TensorLayout{2, 0, 8 * 2 * 32, 2 * 32, 32}));
  EXPECT_EQ(*kv->layers[2].v, (TensorLayout{2, tensor, 8 * 2 * 32, 2 * 32, 32}));

  auto hnd = MakeLayout(id, TensorOrder::kBlocksFirstHnd, /*one_region=*/true);
  ASSERT_TRUE(hnd.ok()) << hnd.status().ToString();
  EXPECT_EQ(hnd->region_bytes, std::vector<uint64_t>{3 * 2 * tensor});
  EXPECT_EQ(hnd->layers[1].k, (TensorLayout{0, 2 * tensor, 2 * 8 * 2 * 32, 32, 8 * 32}));
  EXPECT_EQ(*hnd->layers[1].v, (TensorLayout{0, 2 * tensor + 8 * 2 * 32, 2 * 8 * 2 * 32, 32, 8 * 32}));

  auto sep = MakeLayout(id, TensorOrder::kSeparateHnd);
  ASSERT_TRUE(sep.ok()) << sep.status().ToString();
  EXPECT_EQ(sep->region_bytes, std::vector<uint64_t>(6, tensor));
  EXPECT_EQ(sep->layers[1].k, (TensorLayout{2, 0, 8 * 2 * 32, 32, 8 * 32}));
  EXPECT_EQ(*sep->layers[1].v, (TensorLayout{3, 0, 8 * 2 * 32, 32, 8 * 32}));

  auto mla = MakeLayout(Identity(1, 2, 1, true), TensorOrder::kMla, true);
  ASSERT_TRUE(mla.ok()) << mla.status().ToString();
  EXPECT_FALSE(mla->layers[0].v.has_value());
  EXPECT_EQ(mla->layers[1].k.offset, 10u * 16 * 32);

  EXPECT_EQ(MakeLayout(Identity(), TensorOrder::kMla).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MakeLayout(Identity(1, 1, 0, true), TensorOrder::kKvFirst).status().code(),
            Code::kInvalidArgument);
}

TEST(LayoutTest, TensorOrderNames) {
  for (int i = 0; i <= static_cast<int>(TensorOrder::kMla); ++i) {
    const auto order = static_cast<TensorOrder>(i);
    auto parsed = ParseTensorOrder(TensorOrderName(order));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, order);
  }
  EXPECT_EQ(ParseTensorOrder("nhd").status().code(), Code::kInvalidArgument);
}

// Each invalid layout is refused with a message naming the field.
TEST(LayoutTest, ValidateNamesTheField) {
  auto base = MakeLayout(Identity(8, 2, 1), TensorOrder::kKvFirst);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(base->Validate().ok());
  struct Case {
    const char* field;
    void (*mutate)(CacheLayout&);
  };
  const Case cases[] = {
      {"num_layers", [](CacheLayout& c) { c.num_layers = kMaxLayers + 1; }},
      {"tp_size", [](CacheLayout& c) { c.tp_size = 0; }},
      {"tp_rank", [](CacheLayout& c) { c.tp_rank = 2; }},
      {"tp_size", [](CacheLayout& c) { c.tp_size = 3; c.tp_rank = 0; }},
      {"total_kv_heads", [](CacheLayout& c) { c.total_kv_heads = 0; }},
      {"head_dim", [](CacheLayout& c) { c.head_dim = 0; }},
      {"dtype_bytes", [](CacheLayout& c) { c.dtype_bytes = 0; }},
      {"num_blocks", [](CacheLayout& c) { c.num_blocks = 0; }},
      {"block_tokens", [](CacheLayout& c) { c.block_tokens = 0; }},
      {"kernel_block_tokens", [](CacheLayout& c) { c.kernel_block_tokens = 5; }},
      {"layers", [](CacheLayout& c) { c.layers.pop_back(); }},
      {"layer 1 k.region", [](CacheLayout& c) { c.layers[1].k.region = 3; }},
      {"layer 2 v: absent", [](CacheLayout& c) { c.layers[2].v.reset(); }},
      {"layer 0 v: reaches", [](CacheLayout& c) { c.layers[0].v->offset += 1; }},
      {"layer 1 v: reaches", [](CacheLayout& c) { c.layers[1].v->block_stride += 1; }},
      {"layer 1 v: reaches", [](CacheLayout& c) { c.region_bytes[1] -= 1; }},
      {"layer 2 k: reaches", [](CacheLayout& c) { c.layers[2].k.offset = c.region_bytes[2] - 31; }},
      {"layer 1 k: offset and strides overflow",
       [](CacheLayout& c) { c.layers[1].k.token_stride = uint64_t{1} << 62; }},
      {"num_blocks", [](CacheLayout& c) { c.kernel_block_tokens = 8; c.num_blocks = ~uint64_t{0}; }},
      {"total_kv_heads", [](CacheLayout& c) { c.mla = true; }},
  };
  for (const Case& c : cases) {
    CacheLayout layout = *base;
    c.mutate(layout);
    Status s = layout.Validate();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string_view::npos) << c.field << ": " << s.ToString();
  }
  CacheLayout mla = *MakeLayout(Identity(1, 1, 0, true), TensorOrder::kMla);
  mla.layers[1].v = mla.layers[1].k;
  EXPECT_NE(mla.Validate().message().find("layer 1 v: present"), std::string_view::npos);
}

// ---- heads, routes, partners ----

using V = std::vector<uint32_t>;

TEST(RouteTest, HandChecked) {
  const TpPair p42{8, false, 4, 2};  // sources hold 2 heads, destinations 4
  EXPECT_EQ(RouteHeads(p42, 0, 0), (HeadRange{0, 2}));
  EXPECT_EQ(RouteHeads(p42, 1, 0), (HeadRange{2, 4}));
  EXPECT_TRUE(RouteHeads(p42, 2, 0).empty());
  EXPECT_EQ(RouteHeads(p42, 3, 1), (HeadRange{6, 8}));
  EXPECT_EQ(SourcesOf(p42, 1), (V{2, 3}));
  EXPECT_EQ(DestinationsOf(p42, 3), (V{1}));

  const TpPair p28{8, false, 2, 8};
  EXPECT_EQ(RouteHeads(p28, 0, 3), (HeadRange{3, 4}));
  EXPECT_TRUE(RouteHeads(p28, 1, 3).empty());
  EXPECT_EQ(DestinationsOf(p28, 1), (V{4, 5, 6, 7}));
  EXPECT_EQ(SourcesOf(p28, 5), (V{1}));

  const TpPair p88{8, false, 8, 8};
  EXPECT_EQ(RouteHeads(p88, 5, 5), (HeadRange{5, 6}));
  EXPECT_TRUE(RouteHeads(p88, 5, 4).empty());
  EXPECT_EQ(SourcesOf(p88, 2), (V{2}));

  // Two heads replicated over 4 source ranks: {0,1} hold head 0, {2,3} head 1.
  const TpPair r41{2, false, 4, 1};
  EXPECT_EQ(HeadsOf(2, false, 4, 3), (HeadRange{1, 2}));
  EXPECT_EQ(RouteHeads(r41, 0, 0), (HeadRange{0, 1}));
  EXPECT_EQ(RouteHeads(r41, 2, 0), (HeadRange{1, 2}));
  EXPECT_TRUE(RouteHeads(r41, 1, 0).empty());
  EXPECT_EQ(DestinationsOf(r41, 1), (V{0}));  // sends nothing, still hears of every request
  EXPECT_EQ(SourcesOf(r41, 0), (V{0, 1, 2, 3}));

  const TpPair r14{2, false, 1, 4};
  EXPECT_EQ(RouteHeads(r14, 0, 1), (HeadRange{0, 1}));
  EXPECT_EQ(RouteHeads(r14, 0, 3), (HeadRange{1, 2}));
  EXPECT_EQ(DestinationsOf(r14, 0), (V{0, 1, 2, 3}));

  const TpPair m81{1, true, 8, 1};
  EXPECT_EQ(RouteHeads(m81, 0, 0), (HeadRange{0, 1}));
  EXPECT_TRUE(RouteHeads(m81, 5, 0).empty());
  EXPECT_EQ(DestinationsOf(m81, 5), (V{0}));
  EXPECT_EQ(SourcesOf(m81, 0), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  const TpPair m18{1, true, 1, 8};
  EXPECT_EQ(RouteHeads(m18, 0, 6), (HeadRange{0, 1}));
  EXPECT_EQ(SourcesOf(m18, 6), (V{0}));
  const TpPair m44{1, true, 4, 4};
  EXPECT_EQ(SourcesOf(m44, 2), (V{2}));
  EXPECT_EQ(DestinationsOf(m44, 3), (V{3}));
  // Replicated heads are read from different ranks: destinations 0..3 of MLA 4 -> 4 use
  // 4 different sources.
}

TEST(RouteTest, InvalidSplits) {
  EXPECT_EQ(ValidateTpPair({8, false, 3, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateTpPair({8, false, 1, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateTpPair({6, false, 4, 1}).code(), Code::kInvalidArgument);
  EXPECT_TRUE(ValidateTpPair({6, false, 3, 12}).ok());
  EXPECT_TRUE(ValidateTpPair({1, true, 3, 5}).ok());
}

// Over every valid pair up to TP 16: each head a destination needs comes from exactly one
// source; partners are symmetric; every rank has a partner.
TEST(RouteTest, PropertiesOverAllPairs) {
  int pairs = 0;
  for (uint32_t heads : {1u, 2u, 4u, 8u, 16u, 6u, 12u, 0u}) {
    const bool mla = heads == 0;
    for (uint32_t st = 1; st <= 16; ++st) {
      for (uint32_t dt = 1; dt <= 16; ++dt) {
        const TpPair p{mla ? 1 : heads, mla, st, dt};
        if (!ValidateTpPair(p).ok()) continue;
        ++pairs;
        SCOPED_TRACE(::testing::Message() << "heads " << heads << " tp " << st << "->" << dt);
        for (uint32_t d = 0; d < dt; ++d) {
          const HeadRange need = HeadsOf(p.total_heads, mla, dt, d);
          std::vector<int> got(need.end, 0);
          for (uint32_t s = 0; s < st; ++s) {
            const HeadRange r = RouteHeads(p, s, d);
            if (r.empty()) continue;
            const HeadRange held = HeadsOf(p.total_heads, mla, st, s);
            EXPECT_TRUE(r.begin >= held.begin && r.end <= held.end);
            for (uint32_t h = r.begin; h < r.end; ++h) {
              ASSERT_TRUE(h >= need.begin && h < need.end);
              ++got[h];
            }
          }
          for (uint32_t h = need.begin; h < need.end; ++h) EXPECT_EQ(got[h], 1) << "head " << h;
          const V sources = SourcesOf(p, d);
          EXPECT_FALSE(sources.empty());
          EXPECT_TRUE(std::is_sorted(sources.begin(), sources.end()));
          for (uint32_t s = 0; s < st; ++s) {
            const V dests = DestinationsOf(p, s);
            const bool in_sources = std::count(sources.begin(), sources.end(), s) == 1;
            const bool in_dests = std::count(dests.begin(), dests.end(), d) == 1;
            EXPECT_EQ(in_sources, in_dests) << "s " << s << " d " << d;
            if (!RouteHeads(p, s, d).empty()) EXPECT_TRUE(in_sources);
          }
        }
        for (uint32_t s = 0; s < st; ++s) EXPECT_FALSE(DestinationsOf(p, s).empty());
      }
    }
  }
  EXPECT_GT(pairs, 500);
}

// ---- BuildPlan ----

struct Side {
  TensorOrder order = TensorOrder::kKvFirst;
  bool one_region = false;
  uint32_t tp = 1, rank = 0, block = 16, kernel = 0;
  uint64_t blocks = 64;
};

Result<CacheLayout> Make(const Side& side, uint32_t heads = 8, uint32_t layers = 2,
                         bool mla = false, uint32_t head_dim = 8) {
  CacheLayout c = Identity(heads, side.tp, side.rank, mla);
  c.head_dim = head_dim;
  c.num_layers = layers;
  c.block_tokens = side.block;
  c.kernel_block_tokens = side.kernel;
  c.num_blocks = side.blocks;
  return MakeLayout(c, side.order, side.one_region);
}

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

std::string Describe(const CacheLayout& c) {
  std::ostringstream o;
  o << "tp " << c.tp_rank << "/" << c.tp_size << " heads " << c.total_kv_heads << (c.mla ? " mla" : "")
    << " hb " << c.head_bytes() << " block " << c.block_tokens << "/" << c.kernel_block()
    << " blocks " << c.num_blocks << " regions " << c.region_bytes.size() << " k{" << c.layers[0].k.offset
    << "," << c.layers[0].k.block_stride << "," << c.layers[0].k.token_stride << ","
    << c.layers[0].k.head_stride << "}";
  if (c.layers[0].v) o << " v@" << c.layers[0].v->offset << " r" << c.layers[0].v->region;
  return o.str();
}

// Expands the plan into units and checks it against the reference and its own invariants.
void CheckPlan(const PlanInput& in, const Plan& plan, const std::string& what) {
  SCOPED_TRACE(what);
  const CacheLayout& s = *in.src;
  const CacheLayout& d = *in.dst;
  const uint64_t hb = s.head_bytes();
  const uint64_t tokens = plan.tokens;
  std::vector<reference::Unit> want;
  reference::ForEachUnit(in, tokens, [&](const reference::Unit& u) { want.push_back(u); });
  std::vector<reference::Unit> got;
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> dst_ranges;
  uint64_t bytes = 0;
  size_t next = 0;
  for (const OpGroup& g : plan.groups) {
    ASSERT_EQ(g.begin, next);
    ASSERT_LT(g.begin, g.end);
    next = g.end;
    const uint32_t sr = in.poster_is_src ? g.local_region : g.remote_region;
    const uint32_t dr = in.poster_is_src ? g.remote_region : g.local_region;
    ASSERT_LT(sr, s.region_bytes.size());
    ASSERT_LT(dr, d.region_bytes.size());
    uint64_t group_bytes = 0;
    for (size_t i = g.begin; i < g.end; ++i) {
      const TransferOp& op = plan.ops[i];
      const uint64_t so = in.poster_is_src ? op.local_offset : op.remote_offset;
      const uint64_t dof = in.poster_is_src ? op.remote_offset : op.local_offset;
      ASSERT_GT(op.size, 0u);
      ASSERT_EQ(op.size % hb, 0u);
      ASSERT_LE(so + op.size, s.region_bytes[sr]) << "op " << i << " beyond its source region";
      ASSERT_LE(dof + op.size, d.region_bytes[dr]) << "op " << i << " beyond its destination region";
      for (uint64_t k = 0; k < op.size; k += hb) got.push_back({g.layer, sr, so + k, dr, dof + k});
      dst_ranges.emplace_back(dr, dof, dof + op.size);
      group_bytes += op.size;
    }
    EXPECT_EQ(g.bytes, group_bytes);
    bytes += group_bytes;
  }
  EXPECT_EQ(next, plan.ops.size());
  EXPECT_EQ(plan.bytes, bytes);
  std::sort(dst_ranges.begin(), dst_ranges.end());
  for (size_t i = 1; i < dst_ranges.size(); ++i) {
    if (std::get<0>(dst_ranges[i]) == std::get<0>(dst_ranges[i - 1])) {
      ASSERT_LE(std::get<2>(dst_ranges[i - 1]), std::get<1>(dst_ranges[i])) << "ops overlap at the destination";
    }
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_TRUE(got == want) << "the plan's bytes differ from the reference's";
}

TEST(PlanTest, MatchesReferenceOnRandomCases) {
  std::mt19937_64 rng(0x6b76706c616e);  // fixed: a failure prints its case and recurs
  auto below = [&](uint64_t n) { return rng() % n; };
  const uint32_t blocks[] = {8, 16, 32, 64};
  const uint32_t splits[] = {1, 2, 4, 8};
  int planned = 0;
  for (int iter = 0; iter < 2500; ++iter) {
    const bool mla = below(6) == 0;
    const uint32_t heads = mla ? 1 : splits[below(4)];
    Side side[2];
    for (Side& x : side) {
      x.order = mla ? TensorOrder::kMla : static_cast<TensorOrder>(below(6));
      x.one_region = below(2) == 0;
      x.tp = splits[below(4)];
      x.rank = static_cast<uint32_t>(below(x.tp));
      x.block = blocks[below(4)];
      x.kernel = below(2) ? 0 : x.block >> below(3);
      x.blocks = 4 + below(28);
    }
    const uint32_t layers = 1 + static_cast<uint32_t>(below(3));
    const uint32_t head_dim = 1u << below(4);
    auto src = Make(side[0], heads, layers, mla, head_dim);
    auto dst = Make(side[1], heads, layers, mla, head_dim);
    ASSERT_TRUE(src.ok() && dst.ok()) << src.status().ToString() << dst.status().ToString();
    // Block lists: consecutive from a random start, or a random scatter, at most 256 tokens.
    std::vector<uint64_t> lists[2];
    const uint64_t want_tokens = 1 + below(256);
    for (int i = 0; i < 2; ++i) {
      const Side& x = side[i];
      const uint64_t n = std::min<uint64_t>(x.blocks, (want_tokens + x.block - 1) / x.block + below(2));
      if (below(2)) {
        lists[i] = Range(below(x.blocks - n + 1), n);
      } else {
        std::vector<uint64_t> all = Range(0, x.blocks);
        std::shuffle(all.begin(), all.end(), rng);
        lists[i].assign(all.begin(), all.begin() + n);
      }
    }
    PlanInput in;
    in.src = &*src;
    in.dst = &*dst;
    in.src_blocks = lists[0];
    in.dst_blocks = lists[1];
    const uint64_t capacity = std::min(lists[0].size() * side[0].block, lists[1].size() * side[1].block);
    in.num_tokens = below(3) == 0 ? 0 : below(capacity + 1);
    in.poster_is_src = below(2) == 0;
    if (below(3) == 0) {
      in.first_layer = static_cast<uint32_t>(below(layers));
      in.layer_count = static_cast<uint32_t>(below(layers - in.first_layer + 1));
    }
    const std::string what = "case " + std::to_string(iter) + ": src " +
                             std::string(TensorOrderName(side[0].order)) + " " + Describe(*src) +
                             " blocks " + ::testing::PrintToString(lists[0]) + "; dst " +
                             std::string(TensorOrderName(side[1].order)) + " " + Describe(*dst) +
                             " blocks " + ::testing::PrintToString(lists[1]) + "; tokens " +
                             std::to_string(in.num_tokens) + " poster " +
                             (in.poster_is_src ? "src" : "dst") + " layers " +
                             std::to_string(in.first_layer) + "+" + std::to_string(in.layer_count);
    Plan plan;
    const Status st = BuildPlan(in, &plan);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    EXPECT_EQ(plan.tokens == 0, plan.ops.empty()) << what;
    CheckPlan(in, plan, what);
    if (::testing::Test::HasFatalFailure()) return;
    planned += plan.ops.empty() ? 0 : 1;
  }
  EXPECT_GT(planned, 800);  // most cases move bytes (the others have an empty route)
}

// Equal layouts with consecutive blocks on both sides: one op per tensor per layer (or per
// layer for blocks-first), however the runs are offset.
TEST(PlanTest, MergesRuns) {
  struct Case {
    TensorOrder src_order, dst_order;
    uint32_t src_tp, dst_tp, src_block, dst_block;
    size_t ops_per_layer;
  };
  const Case cases[] = {
      {TensorOrder::kKvFirst, TensorOrder::kKvFirst, 1, 1, 16, 16, 2},
      {TensorOrder::kKvFirstHnd, TensorOrder::kKvFirstHnd, 2, 2, 16, 16, 2},
      {TensorOrder::kSeparate, TensorOrder::kSeparate, 1, 1, 16, 16, 2},
      {TensorOrder::kBlocksFirst, TensorOrder::kBlocksFirst, 1, 1, 16, 16, 1},
      {TensorOrder::kBlocksFirstHnd, TensorOrder::kBlocksFirstHnd, 4, 4, 16, 16, 1},
      {TensorOrder::kKvFirst, TensorOrder::kKvFirst, 1, 1, 16, 64, 2},  // block sizes differ
      {TensorOrder::kKvFirst, TensorOrder::kSeparate, 8, 8, 64, 16, 2},
      // HND head slice of whole blocks (8 source heads, 4 at the destination): one op per
      // block and tensor: 8 blocks of 16 tokens.
      {TensorOrder::kKvFirstHnd, TensorOrder::kKvFirstHnd, 1, 2, 16, 16, 2 * 8},
      // NHD head slice: one op per token and tensor.
      {TensorOrder::kKvFirst, TensorOrder::kKvFirst, 1, 2, 16, 16, 2 * 128},
  };
  for (const Case& c : cases) {
    auto src = Make({c.src_order, false, c.src_tp, 0, c.src_block, 0, 64}, 8, 3);
    auto dst = Make({c.dst_order, false, c.dst_tp, 0, c.dst_block, 0, 64}, 8, 3);
    ASSERT_TRUE(src.ok() && dst.ok());
    const std::vector<uint64_t> sb = Range(5, 128 / c.src_block), db = Range(9, 128 / c.dst_block);
    PlanInput in{&*src, &*dst, sb, db};
    Plan plan;
    ASSERT_TRUE(BuildPlan(in, &plan).ok());
    const std::string what = std::string(TensorOrderName(c.src_order)) + " -> " +
                             std::string(TensorOrderName(c.dst_order)) + " tp " +
                             std::to_string(c.src_tp) + "->" + std::to_string(c.dst_tp);
    EXPECT_EQ(plan.ops.size(), 3 * c.ops_per_layer) << what;
    EXPECT_EQ(plan.tokens, 128u);
    CheckPlan(in, plan, what);
  }
  // Scattered blocks merge nothing across blocks: KV-first gives one op per block and tensor.
  auto a = Make({}, 8, 1);
  const std::vector<uint64_t> sb{1, 3, 5}, db{8, 6, 4};
  Plan plan;
  ASSERT_TRUE(BuildPlan({&*a, &*a, sb, db}, &plan).ok());
  EXPECT_EQ(plan.ops.size(), 6u);
  EXPECT_EQ(plan.groups.size(), 1u);
}

TEST(PlanTest, GroupsPerLayerAndRegionPair) {
  auto sep = Make({TensorOrder::kSeparate}, 8, 3);
  auto kv = Make({TensorOrder::kKvFirst}, 8, 3);
  const std::vector<uint64_t> blocks = Range(0, 2);
  Plan plan;
  PlanInput in{&*kv, &*sep, blocks, blocks};
  in.poster_is_src = false;
  ASSERT_TRUE(BuildPlan(in, &plan).ok());
  ASSERT_EQ(plan.groups.size(), 6u);
  EXPECT_EQ(plan.groups[2].layer, 1u);
  EXPECT_EQ(plan.groups[2].local_region, 2u);  // the poster is the destination: separate K
  EXPECT_EQ(plan.groups[2].remote_region, 1u);
  EXPECT_EQ(plan.groups[3].local_region, 3u);
  EXPECT_EQ(plan.bytes, 3u * 2 * 32 * 8 * 16);
  EXPECT_EQ(plan.heads, (HeadRange{0, 8}));
}

TEST(PlanTest, Errors) {
  auto a = Make({}, 8, 2);
  const std::vector<uint64_t> blocks = Range(0, 4);
  Plan plan;
  auto expect = [&](const CacheLayout& s, const CacheLayout& d, Code code, const char* needle,
                    std::span<const uint64_t> sb, std::span<const uint64_t> db, uint64_t tokens = 0) {
    PlanInput in{&s, &d, sb, db, tokens};
    const Status st = BuildPlan(in, &plan);
    EXPECT_EQ(st.code(), code) << needle << ": " << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string_view::npos) << st.ToString();
    EXPECT_TRUE(plan.ops.empty());
  };
  auto head_dim = Make({}, 8, 2, false, 16);
  expect(*a, *head_dim, Code::kInvalidArgument, "head_dim", blocks, blocks);
  CacheLayout dtype = *a;
  dtype.dtype_bytes = 4;
  expect(*a, dtype, Code::kInvalidArgument, "dtype", blocks, blocks);
  CacheLayout model = *a;
  model.model = "other";
  expect(model, *a, Code::kInvalidArgument, "model", blocks, blocks);
  CacheLayout heads = *Make({}, 4, 2);
  expect(*a, heads, Code::kInvalidArgument, "heads", blocks, blocks);
  CacheLayout split = *a;
  split.tp_size = 3;  // 8 heads over 3 ranks (not a valid layout either)
  expect(*a, split, Code::kInvalidArgument, "dst_tp", blocks, blocks);
  const std::vector<uint64_t> beyond{0, 64};
  expect(*a, *a, Code::kOutOfRange, "dst block 1", blocks, beyond);
  expect(*a, *a, Code::kOutOfRange, "num_tokens", blocks, blocks, 65);
  PlanInput layers{&*a, &*a, blocks, blocks};
  layers.first_layer = 1;
  layers.layer_count = 2;
  EXPECT_EQ(BuildPlan(layers, &plan).code(), Code::kOutOfRange);
  // An empty route or no tokens: an empty plan, not an error.
  auto r1 = Make({TensorOrder::kKvFirst, false, 8, 1}, 8, 2);
  auto r0 = Make({TensorOrder::kKvFirst, false, 8, 0}, 8, 2);
  ASSERT_TRUE(BuildPlan({&*r1, &*r0, blocks, blocks}, &plan).ok());
  EXPECT_TRUE(plan.ops.empty());
  ASSERT_TRUE(BuildPlan({&*a, &*a, {}, blocks}, &plan).ok());
  EXPECT_TRUE(plan.ops.empty());
}

}  // namespace
}  // namespace ferry::kv
