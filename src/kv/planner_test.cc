// CacheLayout geometry and MakeLayout (the standard tensor orders).
#include <gtest/gtest.h>

#include <string>

#include "ferry/kv.h"

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

}  // namespace
}  // namespace ferry::kv
