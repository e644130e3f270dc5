#include "kv_layout.h"

#include <gtest/gtest.h>

#include <set>

namespace ferry::tools {
namespace {

TEST(KvShape, Validates) {
  EXPECT_TRUE(KvShape{}.Validate().ok());
  EXPECT_EQ(KvShape{}.total_bytes(), 1ull << 30);
  EXPECT_EQ((KvShape{2, 4, 12}.Validate().code()), Code::kInvalidArgument);
  EXPECT_EQ((KvShape{0, 4, 16}.Validate().code()), Code::kInvalidArgument);
  EXPECT_EQ((KvShape{1ull << 40, 1ull << 20, 1ull << 20}.Validate().code()),
            Code::kInvalidArgument);
}

TEST(BlockMapping, IsAPermutationWithItsInverse) {
  BlockMapping m = MakeBlockMapping(64, 3);
  std::set<uint64_t> sent(m.send_order.begin(), m.send_order.end());
  std::set<uint64_t> dst(m.dst_of.begin(), m.dst_of.end());
  EXPECT_EQ(sent.size(), 64u);
  EXPECT_EQ(dst.size(), 64u);
  for (uint64_t b = 0; b < 64; ++b) EXPECT_EQ(m.src_of[m.dst_of[b]], b);
}

TEST(PlanLayer, CoversEveryBlockOnBothSidesOfItsLayer) {
  KvShape shape{3, 16, 64};
  BlockMapping m = MakeBlockMapping(shape.blocks, 5);
  std::vector<TransferOp> ops = PlanLayer(shape, m, 1);
  ASSERT_EQ(ops.size(), 32u);
  std::set<uint64_t> local, remote;
  for (const TransferOp& op : ops) {
    EXPECT_EQ(op.size, 64u);
    EXPECT_GE(op.local_offset, shape.Offset(1, 0, 0));
    EXPECT_LT(op.local_offset, shape.Offset(2, 0, 0));
    local.insert(op.local_offset);
    remote.insert(op.remote_offset);
  }
  EXPECT_EQ(local.size(), 32u);
  EXPECT_EQ(remote.size(), 32u);
  EXPECT_EQ(local, remote);  // the same slots, in different places
}

TEST(Pattern, DetectsMisplacedAndCorruptBlocks) {
  std::vector<uint64_t> block(8);
  auto bytes = std::as_writable_bytes(std::span(block));
  FillBlock(2, 1, 9, bytes);
  uint64_t first = 99;
  EXPECT_EQ(CheckBlock(2, 1, 9, bytes, &first), 0u);
  EXPECT_EQ(first, 99u);
  EXPECT_EQ(CheckBlock(2, 1, 8, bytes, &first), 8u);  // another block's data
  EXPECT_EQ(CheckBlock(2, 0, 9, bytes, &first), 8u);  // the K block instead of V
  block[5] ^= 1;
  EXPECT_EQ(CheckBlock(2, 1, 9, bytes, &first), 1u);
  EXPECT_EQ(first, 40u);
  EXPECT_EQ(PatternWord(2, 1, 9, 48), block[6]);
}

}  // namespace
}  // namespace ferry::tools
