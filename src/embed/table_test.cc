#include "ferry/embed.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/thread_pool.h"
#include "cuda/runtime.h"
#include "embed/config.h"
#include "testing/embed_core.h"
#include "testing/embed_files.h"

namespace ferry::embed {
namespace {

using testing::OneTensorHeader;
using testing::Safetensors;
using testing::TempFile;

// V 100, EOS 1, N 3, H 2: a layout of 4 heads of d = 8 over primes >= 5: sizes 5, 7, 11, 13
// (36 rows, padded to P 8: 40).
Layout TinyLayout() {
  return Layout::Create(testing::ConfigOf({100, 1, 3, 2, 8, 5, 8})).value();
}

std::string RowData(uint64_t rows, uint64_t row_bytes, uint64_t first_row) {
  std::string data(rows * row_bytes, '\0');
  for (uint64_t r = 0; r < rows; ++r)
    SyntheticRow(first_row + r, row_bytes, reinterpret_cast<uint8_t*>(data.data() + r * row_bytes));
  return data;
}

TEST(Table, TinyLayoutRows) {
  Layout l = TinyLayout();
  EXPECT_EQ(l.used_rows(), 36u);
  EXPECT_EQ(l.table_rows(), 40u);
}

TEST(Table, SyntheticPattern) {
  Layout l = TinyLayout();
  ThreadPool pool(2, "table-test");
  auto t = Table::Synthetic(l, Dtype::kNvfp4, &pool);  // d = 8 is not a multiple of 16
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  auto table = Table::Synthetic(l, Dtype::kBf16, &pool);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ((*table)->rows(), 40u);
  EXPECT_EQ((*table)->row_bytes(), 16u);
  EXPECT_TRUE((*table)->synthetic());
  for (uint64_t r = 0; r < 40; ++r) {
    uint8_t want[16];
    SyntheticRow(r, 16, want);
    ASSERT_EQ(std::memcmp((*table)->Row(r), want, 16), 0) << r;
  }
  // The pattern itself: word 0 of row 0 is SplitMix64(0), little-endian.
  uint64_t w0;
  std::memcpy(&w0, (*table)->Row(0), 8);
  EXPECT_EQ(w0, SplitMix64(0));
  uint8_t odd[13];
  SyntheticRow(9, 13, odd);  // a row that is not a whole number of words
  uint64_t w1 = SplitMix64(9) + kGolden;
  EXPECT_EQ(std::memcmp(odd + 8, &w1, 5), 0);
  EXPECT_EQ(Table::Synthetic(l, Dtype::kF32, nullptr, 35).status().code(), Code::kInvalidArgument);
}

TEST(Table, OpensOneFile) {
  Layout l = TinyLayout();
  std::string data = RowData(40, 16, 0);
  TempFile f(Safetensors(OneTensorHeader("ngram", "BF16", 40, 8, data.size()), data));
  auto table = Table::Open(l, std::vector<std::string>{f.path()}, {});
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ((*table)->rows(), 40u);
  EXPECT_EQ((*table)->dtype(), Dtype::kBf16);
  ASSERT_NE((*table)->data(), nullptr);
  EXPECT_EQ(std::memcmp((*table)->data(), data.data(), data.size()), 0);
}

TEST(Table, OpensShardsAsOneTable) {
  Layout l = TinyLayout();
  // 36 unpadded rows in three files of 10, 0 and 26 rows, f8 (1 byte per value).
  std::string a = RowData(10, 8, 0), b, c = RowData(26, 8, 10);
  TempFile fa(Safetensors(OneTensorHeader("w", "F8_E4M3", 10, 8, a.size()), a));
  TempFile fb(Safetensors(OneTensorHeader("w", "F8_E4M3", 0, 8, 0), b));
  TempFile fc(Safetensors(OneTensorHeader("w", "F8_E4M3", 26, 8, c.size()), c));
  Table::OpenOptions options;
  options.tensor_name = "w";
  options.populate = true;
  auto table = Table::Open(l, std::vector<std::string>{fa.path(), fb.path(), fc.path()}, options);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ((*table)->rows(), 36u);
  EXPECT_EQ((*table)->segments().size(), 2u);
  EXPECT_EQ((*table)->data(), nullptr);
  for (uint64_t r = 0; r < 36; ++r) {
    uint8_t want[8];
    SyntheticRow(r, 8, want);
    ASSERT_EQ(std::memcmp((*table)->Row(r), want, 8), 0) << r;
  }
}

TEST(Table, OpenErrors) {
  Layout l = TinyLayout();
  std::string data = RowData(40, 16, 0);
  auto open = [&](const std::string& file, Table::OpenOptions options = {}) {
    TempFile f(file);
    return Table::Open(l, std::vector<std::string>{f.path()}, options).status().code();
  };
  EXPECT_EQ(open(Safetensors(OneTensorHeader("w", "BF16", 39, 8, 39 * 16), data.substr(16))),
            Code::kInvalidArgument);  // rows match neither 40 nor 36
  EXPECT_EQ(open(Safetensors(OneTensorHeader("w", "BF16", 20, 16, data.size()), data)),
            Code::kInvalidArgument);  // row width is neither d nor E
  EXPECT_EQ(open(Safetensors(OneTensorHeader("w", "BF16", 10, 32, data.size()), data)),
            Code::kOk);  // [rows / G, E]: the same bytes
  EXPECT_EQ(open(Safetensors(OneTensorHeader("w", "I32", 40, 4, data.size()), data)),
            Code::kInvalidArgument);  // not a table dtype
  EXPECT_EQ(open(Safetensors(OneTensorHeader("w", "BF16", 40, 8, data.size()), data),
                 {.tensor_name = "other"}),
            Code::kInvalidArgument);  // no such tensor
  EXPECT_EQ(open("short"), Code::kInvalidArgument);
  EXPECT_EQ(open(Safetensors("{\"w\": 1}", data)), Code::kInvalidArgument);  // parser errors
  std::string two =
      "{\"a\": {\"dtype\": \"BF16\", \"shape\": [20, 8], \"data_offsets\": [0, 320]},"
      " \"b\": {\"dtype\": \"BF16\", \"shape\": [20, 8], \"data_offsets\": [320, 640]}}";
  EXPECT_EQ(open(Safetensors(two, data)), Code::kInvalidArgument);  // two tensors, none named
  EXPECT_EQ(Table::Open(l, std::vector<std::string>{"/nonexistent/ferry.safetensors"}, {})
                .status()
                .code(),
            Code::kNotFound);
  EXPECT_EQ(Table::Open(l, std::vector<std::string>{}, {}).status().code(), Code::kInvalidArgument);
  // Shards of different dtypes.
  std::string half = RowData(20, 16, 0);
  TempFile fa(Safetensors(OneTensorHeader("w", "BF16", 20, 8, half.size()), half));
  TempFile fb(Safetensors(OneTensorHeader("w", "F16", 20, 8, half.size()), half));
  EXPECT_EQ(Table::Open(l, std::vector<std::string>{fa.path(), fb.path()}, {}).status().code(),
            Code::kInvalidArgument);
}

// A FIFO (or a folder) is refused at once, without an open that waits for a writer. The helper
// opens the FIFO's write end after a second, which would release an open() blocked on it.
TEST(Table, NonRegularFilesAreRefusedWithoutBlocking) {
  Layout l = TinyLayout();
  std::string fifo = "/tmp/ferry_embed_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    for (int i = 0; i < 200 && !done; ++i) {
      int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // succeeds once a reader waits
      if (fd >= 0) {
        ::close(fd);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Table>> t = Table::Open(l, std::vector<std::string>{fifo}, {});
  auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  releaser.join();
  ::unlink(fifo.c_str());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << t.status().ToString();
  EXPECT_NE(t.status().message().find("not a regular file"), std::string_view::npos);
  EXPECT_LT(took, std::chrono::milliseconds(500));
  EXPECT_EQ(Table::Open(l, std::vector<std::string>{"/tmp"}, {}).status().code(),
            Code::kInvalidArgument);
}

TEST(Table, PinWithoutGpu) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present; the GPU tests pin tables";
  auto table = Table::Synthetic(TinyLayout(), Dtype::kF32);
  ASSERT_TRUE(table.ok());
  Status s = (*table)->Pin();
  EXPECT_EQ(s.code(), cuda::Built() ? Code::kFailedPrecondition : Code::kUnsupported);
  EXPECT_FALSE((*table)->pinned());
}

}  // namespace
}  // namespace ferry::embed
