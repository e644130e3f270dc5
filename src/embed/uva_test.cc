// The UVA mode against the CPU path, byte for byte. Needs a GPU; skips (saying why) without.
// Run: build/release/src/embed/embed_uva_test
#include "embed/uva.h"

#include <gtest/gtest.h>

#include <vector>

#include "cuda/runtime.h"
#include "embed/gather.h"
#include "testing/embed_core.h"
#include "testing/embed_files.h"

namespace ferry::embed {
namespace {

using testing::RandomStep;
using testing::Step;

Layout MakeLayout(int n, int h, int64_t d, uint64_t base, int64_t vocab = 3000) {
  Config c = testing::ConfigOf({vocab, /*eos=*/7, n, h, d, base, /*padding=*/128});
  c.seed = 99 + n;
  return Layout::Create(c).value();
}

// Device memory freed at scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    auto r = cuda::Malloc(0, bytes ? bytes : 1);
    if (r.ok()) ptr = *r;
  }
  ~DeviceBuffer() {
    if (ptr) (void)cuda::Free(ptr);
  }
  void* ptr = nullptr;
  size_t bytes;
};

void ExpectSameAsCpu(const Layout& l, const Table& table, UvaGatherer& uva, const Step& step) {
  const size_t bytes = step.tokens.size() * l.num_heads() * table.row_bytes();
  std::vector<uint8_t> cpu(bytes);
  auto gatherer = Gatherer::Create({.threads = 2}).value();
  ASSERT_TRUE(gatherer->GatherStep(l, table, step.input(), cpu).ok());
  DeviceBuffer dst(bytes);
  ASSERT_NE(dst.ptr, nullptr);
  ASSERT_TRUE(cuda::MemsetSync(dst.ptr, 0xAB, dst.bytes).ok());
  Status s = uva.GatherSync(step.input(), dst.ptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<uint8_t> gpu(bytes);
  if (bytes) {
    ASSERT_TRUE(cuda::CopySync(gpu.data(), dst.ptr, bytes).ok());
  }
  ASSERT_EQ(gpu, cpu);
}

TEST(Uva, CreateNeedsGpuAndPinnedTable) {
  Layout l = MakeLayout(3, 2, 16, 500);
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  auto uva = UvaGatherer::Create(l, *table);
  EXPECT_EQ(uva.status().code(), Code::kFailedPrecondition);  // no GPU here, or not pinned
}

TEST(Uva, MatchesCpuByteForByte) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  for (int n = 2; n <= 4; ++n) {
    for (Dtype dtype : {Dtype::kBf16, Dtype::kF8E4M3, Dtype::kNvfp4, Dtype::kF32}) {
      Layout l = MakeLayout(n, 3, 32, 1000 + n);
      auto table = Table::Synthetic(l, dtype).value();
      ASSERT_TRUE(table->Pin().ok());
      auto uva = UvaGatherer::Create(l, *table);
      ASSERT_TRUE(uva.ok()) << uva.status().ToString();
      for (uint32_t seed = 0; seed < 4; ++seed) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << n << " " << DtypeName(dtype) << " seed " << seed);
        ExpectSameAsCpu(l, *table, **uva,
                        RandomStep(l, 1 + seed * 5, 1 + seed * 40, seed * 3, seed));
      }
    }
  }
}

TEST(Uva, ModelShapedLargeStep) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  Config c = Config::Model(1);
  c.base_vocab = 100'000;  // the model's heads, a 512 MB table
  Layout l = Layout::Create(c).value();
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  ASSERT_TRUE(table->Pin().ok());
  auto uva = UvaGatherer::Create(l, *table).value();
  ExpectSameAsCpu(l, *table, *uva, RandomStep(l, 8, 2048, 100, 1));  // prefill-like
  ExpectSameAsCpu(l, *table, *uva, RandomStep(l, 256, 1, 0, 2));     // decode-like
}

TEST(Uva, FileTablePinnedReadOnly) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  Layout l = MakeLayout(3, 2, 16, 500);
  const uint64_t rows = l.table_rows(), row_bytes = 32;
  std::string data(rows * row_bytes, '\0');
  for (uint64_t r = 0; r < rows; ++r)
    SyntheticRow(r * 3 + 1, row_bytes, reinterpret_cast<uint8_t*>(data.data() + r * row_bytes));
  testing::TempFile file(
      testing::Safetensors(testing::OneTensorHeader("w", "BF16", rows, 16, data.size()), data));
  auto table = Table::Open(l, std::vector<std::string>{file.path()}, {}).value();
  Status pin = table->Pin();
  ASSERT_TRUE(pin.ok()) << pin.ToString();
  auto uva = UvaGatherer::Create(l, *table).value();
  ExpectSameAsCpu(l, *table, *uva, RandomStep(l, 5, 30, 4, 9));
}

TEST(Uva, Errors) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  Layout l = MakeLayout(3, 2, 16, 500);
  auto table = Table::Synthetic(l, Dtype::kBf16).value();
  EXPECT_EQ(UvaGatherer::Create(l, *table).status().code(), Code::kFailedPrecondition);
  ASSERT_TRUE(table->Pin().ok());
  auto uva = UvaGatherer::Create(l, *table).value();
  DeviceBuffer dst(4 * l.num_heads() * table->row_bytes());
  Step bad_id{{1, 2, 3000, 4}, {0, 4}, {0, 0}};
  EXPECT_EQ(uva->GatherSync(bad_id.input(), dst.ptr).code(), Code::kOutOfRange);
  Step bad_qsl{{1, 2, 3, 4}, {0, 3, 2}, {0, 0, 0, 0}};
  EXPECT_EQ(uva->GatherSync(bad_qsl.input(), dst.ptr).code(), Code::kInvalidArgument);
  Step too_far{{1, 2, 3, 4}, {0, 5}, {0, 0}};
  EXPECT_EQ(uva->GatherSync(too_far.input(), dst.ptr).code(), Code::kOutOfRange);
  Step good{{1, 2, 3, 4}, {0, 4}, {0, 0}};
  EXPECT_TRUE(uva->GatherSync(good.input(), dst.ptr).ok());  // errors were cleared
  EXPECT_EQ(uva->GatherSync(StepInput{good.tokens, good.qsl, {}}, dst.ptr).code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::embed
