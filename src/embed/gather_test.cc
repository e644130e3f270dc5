#include "embed/gather.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "base/mutex.h"
#include "testing/embed_core.h"

namespace ferry::embed {
namespace {

using testing::RandomStep;
using testing::Step;

Layout SmallLayout(int n = 3) {
  // V 5000, EOS 3, N n, H 2, d 32, B 1000, P 64.
  return Layout::Create(testing::ConfigOf({5000, 3, n, 2, 32, 1000, 64})).value();
}

// The expected output: each row copied from the table, zeros for padding.
std::vector<uint8_t> Expected(const Table& table, const std::vector<uint64_t>& ids) {
  std::vector<uint8_t> out(ids.size() * table.row_bytes(), 0);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != kPaddingRow)
      std::memcpy(out.data() + i * table.row_bytes(), table.Row(ids[i]), table.row_bytes());
  return out;
}

class GatherTest : public ::testing::TestWithParam<int> {};

TEST_P(GatherTest, RowsMatchTableAndPaddingIsZero) {
  const int threads = GetParam();
  Layout l = SmallLayout();
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  Step step = RandomStep(l, 9, 300, 17, 11);
  std::vector<uint64_t> ids(step.tokens.size() * l.num_heads());
  ASSERT_TRUE(ComputeRowIds(l, step.input(), ids).ok());
  auto gatherer = Gatherer::Create({.threads = threads, .chunk_tokens = 7}).value();
  std::vector<uint8_t> dst(ids.size() * table->row_bytes(), 0xAB);
  Mutex mu;
  std::multiset<std::pair<int64_t, int64_t>> chunks;
  Status s = gatherer->Gather(*table, l.num_heads(), ids, dst, [&](int64_t b, int64_t e) {
    MutexLock lock(&mu);
    chunks.insert({b, e});
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(dst, Expected(*table, ids));
  // Each row checked against the synthetic pattern too (no second copy needed).
  std::vector<uint8_t> row(table->row_bytes());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == kPaddingRow) continue;
    SyntheticRow(ids[i], row.size(), row.data());
    ASSERT_EQ(std::memcmp(dst.data() + i * row.size(), row.data(), row.size()), 0) << i;
  }
  // Every token in exactly one reported chunk.
  int64_t next = 0;
  for (const auto& [b, e] : chunks) {
    EXPECT_EQ(b, next);
    EXPECT_GT(e, b);
    next = e;
  }
  EXPECT_EQ(next, static_cast<int64_t>(step.tokens.size()));

  // GatherStep computes the ids itself and writes the same bytes.
  std::vector<uint8_t> fused(dst.size(), 0xCD);
  ASSERT_TRUE(gatherer->GatherStep(l, *table, step.input(), fused).ok());
  EXPECT_EQ(fused, dst);
  // So does each per-call choice of stores (16-byte aligned: the streaming path runs).
  for (auto stores : {Gatherer::Stores::kStreaming, Gatherer::Stores::kNormal}) {
    std::vector<uint8_t> other(dst.size() + 16, 0xEF);
    uint8_t* at = other.data() + (16 - reinterpret_cast<uintptr_t>(other.data()) % 16) % 16;
    std::span<uint8_t> aligned(at, dst.size());
    ASSERT_TRUE(gatherer->GatherStep(l, *table, step.input(), aligned, nullptr, stores).ok());
    EXPECT_TRUE(std::equal(aligned.begin(), aligned.end(), dst.begin()));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GatherTest, ::testing::Values(1, 2, 4));

TEST(Gather, OtherDtypesStoresAndAlignments) {
  for (Dtype dtype : {Dtype::kF8E4M3, Dtype::kF32, Dtype::kNvfp4}) {
    Layout l = SmallLayout(2);
    auto table = Table::Synthetic(l, dtype).value();
    Step step = RandomStep(l, 3, 50, 2, 5);
    std::vector<uint64_t> ids(step.tokens.size() * l.num_heads());
    ASSERT_TRUE(ComputeRowIds(l, step.input(), ids).ok());
    const std::vector<uint8_t> want = Expected(*table, ids);
    for (bool nt : {false, true}) {
      auto gatherer =
          Gatherer::Create(
              {.threads = 2, .chunk_tokens = 5, .prefetch_rows = 0, .streaming_stores = nt})
              .value();
      std::vector<uint8_t> dst(ids.size() * table->row_bytes());
      ASSERT_TRUE(gatherer->Gather(*table, l.num_heads(), ids, dst).ok());
      EXPECT_EQ(dst, want) << DtypeName(dtype) << " nt " << nt;
      // A destination that is not 16-byte aligned takes the plain copy.
      std::vector<uint8_t> buffer(dst.size() + 1, 0x77);
      std::span<uint8_t> odd(buffer.data() + 1, dst.size());
      ASSERT_TRUE(gatherer->Gather(*table, l.num_heads(), ids, odd).ok());
      EXPECT_TRUE(std::equal(odd.begin(), odd.end(), want.begin())) << DtypeName(dtype);
      EXPECT_EQ(buffer[0], 0x77);
    }
  }
}

// Every width of non-temporal store the CPU has (StreamStoreWidth), at every alignment of the
// destination within a line and for rows of 32, 64 and 128 bytes: the same bytes as memcpy,
// padding and bad rows zeroed, the first bad row reported, nothing written outside dst.
TEST(Gather, StreamingStoresOfEveryWidthAndAlignment) {
  const int cpu = StreamStoreWidth();
  if (cpu == 0) GTEST_SKIP() << "no streaming stores on this CPU: GatherRows copies with memcpy";
  Layout l = SmallLayout();
  for (Dtype dtype : {Dtype::kF8E4M3, Dtype::kBf16, Dtype::kF32}) {
    auto table = Table::Synthetic(l, dtype).value();
    const uint64_t rb = table->row_bytes();
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 200; ++i) ids.push_back((i * 7919) % table->rows());
    ids[3] = kPaddingRow;
    ids[50] = table->rows();  // the first bad row
    ids[120] = table->rows() + 9;
    std::vector<uint64_t> good = ids;
    good[50] = good[120] = kPaddingRow;
    const std::vector<uint8_t> want = Expected(*table, good);
    for (int width : {16, 32, 64}) {
      for (size_t offset : {0, 16, 32, 48, 8}) {
        std::vector<uint8_t> buffer(want.size() + 192, 0x5A);
        uint8_t* line = buffer.data() + (64 - reinterpret_cast<uintptr_t>(buffer.data()) % 64) % 64;
        uint8_t* dst = line + offset;
        const int64_t bad = GatherRows(*table, ids.data(), static_cast<int64_t>(ids.size()), dst,
                                       {.prefetch_rows = 4, .streaming_stores = true}, width);
        EXPECT_EQ(bad, 50) << DtypeName(dtype) << " width " << width << " offset " << offset;
        EXPECT_EQ(std::memcmp(dst, want.data(), want.size()), 0)
            << DtypeName(dtype) << " width " << width << " offset " << offset << " cpu " << cpu;
        for (uint8_t* p = buffer.data(); p < dst; ++p) ASSERT_EQ(*p, 0x5A);
        for (uint8_t* p = dst + want.size(); p < buffer.data() + buffer.size(); ++p)
          ASSERT_EQ(*p, 0x5A);
      }
    }
    EXPECT_EQ(rb % 16, 0u);
  }
}

TEST(Gather, Errors) {
  Layout l = SmallLayout();
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  auto gatherer = Gatherer::Create({.threads = 2}).value();
  const uint64_t rb = table->row_bytes();
  std::vector<uint64_t> ids = {0, 1, table->rows(), 2, kPaddingRow, table->rows() + 5, 7, 8};
  std::vector<uint8_t> dst(ids.size() * rb, 0xEE);
  Status s = gatherer->Gather(*table, 4, ids, dst);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("token 0 reads row"), std::string::npos) << s.ToString();
  for (size_t i : {2, 4, 5})  // the bad and padding rows are zeros
    for (uint64_t k = 0; k < rb; ++k) ASSERT_EQ(dst[i * rb + k], 0) << i;
  EXPECT_EQ(std::memcmp(dst.data() + 7 * rb, table->Row(8), rb), 0);  // the rest is gathered

  EXPECT_EQ(gatherer->Gather(*table, 3, ids, dst).code(), Code::kInvalidArgument);  // 8 % 3
  EXPECT_EQ(gatherer->Gather(*table, 0, ids, dst).code(), Code::kInvalidArgument);
  std::vector<uint8_t> small(dst.size() - 1);
  EXPECT_EQ(gatherer->Gather(*table, 4, ids, small).code(), Code::kInvalidArgument);
  EXPECT_EQ(Gatherer::Create({.threads = 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Gatherer::Create({.chunk_tokens = 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Gatherer::Create({.prefetch_rows = -1}).status().code(), Code::kInvalidArgument);

  // GatherStep validates the step and writes nothing on error.
  Step step = RandomStep(l, 2, 10, 0, 1);
  step.tokens[0] = 5000;  // id == V
  std::vector<uint8_t> out(step.tokens.size() * l.num_heads() * rb, 0x11);
  EXPECT_EQ(gatherer->GatherStep(l, *table, step.input(), out).code(), Code::kOutOfRange);
  for (uint8_t b : out) ASSERT_EQ(b, 0x11);
  // A table of another layout's row size.
  auto f32 = Table::Synthetic(l, Dtype::kF32).value();
  step.tokens[0] = 1;
  std::vector<uint8_t> out32(step.tokens.size() * l.num_heads() * f32->row_bytes());
  EXPECT_EQ(gatherer->GatherStep(l, *f32, step.input(), out).code(), Code::kInvalidArgument);
  EXPECT_TRUE(gatherer->GatherStep(l, *f32, step.input(), out32).ok());
}

}  // namespace
}  // namespace ferry::embed
