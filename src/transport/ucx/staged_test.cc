// The staged path's planning (no GPU needed): chunks respect their byte and piece limits and
// cover every op exactly once; the staged messages' headers decode (their payloads:
// staged_wire_test.cc).
#include "transport/ucx/staged.h"

#include <gtest/gtest.h>

#include <random>

namespace ferry::internal::ucx {
namespace {

TEST(StagedPlan, ChunksCoverEveryByteOnceWithinTheirLimits) {
  std::mt19937_64 rng(3);
  std::vector<TransferOp> ops;
  uint64_t total = 0;
  for (int i = 0; i < 3000; ++i) {
    uint64_t size = 1 + rng() % (i % 100 == 0 ? (10 << 20) : (64 << 10));
    ops.push_back({total, total * 2 + 7, size});
    total += size;
  }
  auto chunks = PlanChunks(ops, 1 << 20, 64);
  uint64_t seen = 0;
  size_t op = 0;
  uint64_t in_op = 0;
  for (const auto& c : chunks) {
    EXPECT_LE(c.bytes, 1u << 20);
    EXPECT_LE(c.remote.size(), 64u);
    ASSERT_EQ(c.remote.size(), c.local_offsets.size());
    uint64_t sum = 0;
    for (size_t k = 0; k < c.remote.size(); ++k) {
      // Pieces follow the ops in order, cut where a chunk fills up.
      ASSERT_LT(op, ops.size());
      EXPECT_EQ(c.local_offsets[k], ops[op].local_offset + in_op);
      EXPECT_EQ(c.remote[k].offset, ops[op].remote_offset + in_op);
      in_op += c.remote[k].size;
      if (in_op == ops[op].size) {
        ++op;
        in_op = 0;
      }
      sum += c.remote[k].size;
    }
    EXPECT_EQ(sum, c.bytes);
    seen += sum;
  }
  EXPECT_EQ(op, ops.size());
  EXPECT_EQ(seen, total);
  // A KV-shaped batch: 80,000 pieces of 32 KiB make 625 chunks of 4 MiB.
  std::vector<TransferOp> kv;
  for (uint64_t i = 0; i < 80000; ++i) kv.push_back({i * 32768, i * 32768, 32768});
  EXPECT_EQ(PlanChunks(kv, kStageChunkBytes, kStageMaxPieces).size(), 625u);
  EXPECT_TRUE(PlanChunks({}, kStageChunkBytes, kStageMaxPieces).empty());
}

TEST(StagedWire, NewMessagesDecodeWithTheirPayloads) {
  AmHeader h;
  h.type = MsgType::kStagedWrite;
  h.conn = 5;
  h.size = 100;
  uint8_t raw[kAmHeaderBytes];
  EncodeHeader(h, raw);
  EXPECT_TRUE(DecodeHeader(raw, sizeof(raw), 100).ok());
  EXPECT_EQ(DecodeHeader(raw, sizeof(raw), 99).status().code(), Code::kInvalidArgument);
  h.type = MsgType::kStagedReadReq;
  h.size = 20;
  EncodeHeader(h, raw);
  EXPECT_TRUE(DecodeHeader(raw, sizeof(raw), 20).ok());
  raw[1] = 11;  // past the last message type
  EXPECT_EQ(DecodeHeader(raw, sizeof(raw), 20).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::internal::ucx
