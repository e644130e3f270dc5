// The local transport's CUDA path, end to end through two engines of this process: host and
// device memory in every direction, single ops and batches of thousands of scattered pieces
// (random data, odd sizes, misaligned offsets), deadlines, notifications, many posters.
// Every test skips where no CUDA device is usable, and ferry::CudaAvailable says why.
// Bandwidth: local_cuda_bench_test.cc.
#include "ferry/system.h"
#include "testing/cuda_engine_pair.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers

TEST(CudaRuntime, ReportsWhyItIsUnavailable) {
  std::string reason;
  if (CudaAvailable(&reason)) {
    EXPECT_TRUE(cuda::UnavailableReason().empty());
    EXPECT_GT(cuda::DeviceCount(), 0);
  } else {
    EXPECT_FALSE(reason.empty());
    EXPECT_EQ(cuda::DeviceCount(), 0);
    EXPECT_EQ(cuda::Malloc(0, 16).status().code(), cuda::Built() ? Code::kFailedPrecondition : Code::kUnsupported);
  }
}

struct PathCase {
  const char* name;
  Loc a, b;
  bool pin;  // EngineOptions::pin_host_memory
  int gpus;
};

class CudaPathTest : public ::testing::TestWithParam<PathCase> {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_CUDA(GetParam().gpus); }
  std::unique_ptr<Pair> MakePair(size_t bytes) {
    EngineOptions options;
    options.pin_host_memory = GetParam().pin;
    return Pair::Make(GetParam().a, GetParam().b, bytes, options);
  }
  // Writes `ops` from a random a to b, checks b; then reads them back into a zeroed a.
  void RoundTrip(Pair& p, const std::vector<TransferOp>& ops, uint64_t seed) {
    auto data = RandomBytes(p.a_buf->size(), seed);
    p.a_buf->Upload(data);
    Transfer w = p.session.WriteBatch(ops);
    ASSERT_TRUE(w.Wait().ok()) << w.status().ToString();
    auto at_b = p.b_buf->Download();
    ExpectApplied(data, at_b, ops, /*write=*/true);
    p.a_buf->Upload(std::vector<uint8_t>(p.a_buf->size(), 0));
    Transfer r = p.session.ReadBatch(ops);
    ASSERT_TRUE(r.Wait().ok()) << r.status().ToString();
    ExpectApplied(at_b, p.a_buf->Download(), ops, /*write=*/false);
  }
};

TEST_P(CudaPathTest, SingleWriteAndRead) {
  auto p = MakePair(1 << 16);
  ASSERT_TRUE(p);
  auto data = RandomBytes(1 << 16, 1);
  p->a_buf->Upload(data);
  Transfer t = p->session.Write(100, 200, 5000);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(t.bytes(), 5000u);
  EXPECT_EQ(t.path().transport, "local");
  auto b = p->b_buf->Download();
  EXPECT_EQ(std::memcmp(b.data() + 200, data.data() + 100, 5000), 0);
  EXPECT_EQ(b[199], 0);
  EXPECT_EQ(b[5200], 0);

  p->a_buf->Upload(std::vector<uint8_t>(1 << 16, 0));
  Transfer r = p->session.Read(7, 200, 5000);
  ASSERT_TRUE(r.Wait().ok()) << r.status().ToString();
  auto a = p->a_buf->Download();
  EXPECT_EQ(std::memcmp(a.data() + 7, data.data() + 100, 5000), 0);
  EXPECT_EQ(a[6], 0);
  EXPECT_EQ(a[5007], 0);
}

TEST_P(CudaPathTest, ThousandsOfScatteredMisalignedPieces) {
  const size_t kBytes = 16 << 20;
  auto p = MakePair(kBytes);
  ASSERT_TRUE(p);
  RoundTrip(*p, Scattered(kBytes, 4096, 4000, 2), 3);
  RoundTrip(*p, Scattered(kBytes, 1000, 16 << 10, 4), 5);
  RoundTrip(*p, Scattered(kBytes, 20000, 100, 6), 7);  // tiny pieces
}

TEST_P(CudaPathTest, AlignedSmallAndLargePiecesInOneBatch) {
  const size_t kBytes = 64 << 20;
  auto p = MakePair(kBytes);
  ASSERT_TRUE(p);
  std::vector<TransferOp> ops;
  // 1024 aligned 32 KiB pieces, reversed on the remote side (the kernel's 16-byte path) ...
  for (uint64_t i = 0; i < 1024; ++i) ops.push_back({i * 32768, (1023 - i) * 32768, 32768});
  // ... three pieces for the DMA engines, one of them misaligned and odd-sized ...
  ops.push_back({32 << 20, 40 << 20, 2 << 20});
  ops.push_back({(36 << 20) + 3, (48 << 20) + 5, (3 << 20) + 1});
  ops.push_back({56 << 20, 60 << 20, 1 << 20});
  // ... and pieces with every relative alignment (skew 1, 2, 4, 8) the kernel handles.
  for (uint64_t skew : {1, 2, 4, 8, 12})
    ops.push_back({(50 << 20) + 100000 * skew, (52 << 20) + 100000 * skew + skew, 70000 + skew});
  RoundTrip(*p, ops, 8);
}

TEST_P(CudaPathTest, FewPiecesGoToTheCopyEngines) {
  auto p = MakePair(8 << 20);
  ASSERT_TRUE(p);
  RoundTrip(*p, {{0, 4 << 20, 3 << 20}, {(3 << 20) + 1, 17, 12345}, {(7 << 20), (7 << 20) + 9, 99}}, 9);
}

TEST_P(CudaPathTest, EmptyOpsAndEmptyBatch) {
  auto p = MakePair(4096);
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->session.WriteBatch({}).Wait().ok());
  std::vector<TransferOp> zeros = {{0, 0, 0}, {4096, 4096, 0}};
  EXPECT_TRUE(p->session.WriteBatch(zeros).Wait().ok());
  EXPECT_EQ(p->session.Write(4000, 0, 97).Wait().code(), Code::kOutOfRange);
}

// One side of the batch in runs that lie end to end (a request's blocks offloaded into one
// host slab, or loaded back), the other side scattered, and then the other way round: between
// this device and page-locked host memory the runs go through device staging (one DMA copy a
// chunk, counted with the engine's DMA calls); on every path the bytes land where the ops say.
TEST_P(CudaPathTest, RunsEndToEndOnOneSideAndScatteredOnTheOther) {
  const size_t kPiece = 16 << 10, kPieces = 1600, kBytes = kPiece * kPieces;  // 25 MiB: two chunks
  auto p = MakePair(kBytes);
  ASSERT_TRUE(p);
  std::vector<uint64_t> slots(kPieces);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(8));
  std::vector<TransferOp> remote_runs, local_runs;
  for (uint64_t i = 0; i < kPieces; ++i) {
    remote_runs.push_back({slots[i] * kPiece, i * kPiece, kPiece});
    local_runs.push_back({i * kPiece, slots[i] * kPiece, kPiece});
  }
  const uint64_t dma_before = p->a->stats().gpu_dma_calls;
  RoundTrip(*p, remote_runs, 10);
  RoundTrip(*p, local_runs, 11);
  const PathCase& c = GetParam();
  const bool staged = c.pin && (c.a.kind == MemoryKind::kHost) != (c.b.kind == MemoryKind::kHost);
  // Four batches, two of them with the host side end to end (a write and a read); where
  // staged, each of those is two chunks (16 + 9 MiB), one DMA copy each.
  if (staged) {
    EXPECT_EQ(p->a->stats().gpu_dma_calls - dma_before, 4u);
  } else if (c.pin) {
    EXPECT_EQ(p->a->stats().gpu_dma_calls - dma_before, 0u);  // the kernel's alone
  }
}

INSTANTIATE_TEST_SUITE_P(
    Paths, CudaPathTest,
    ::testing::Values(PathCase{"HostToDevice", kHostLoc, kGpu0, true, 1},
                      PathCase{"DeviceToHost", kGpu0, kHostLoc, true, 1},
                      PathCase{"DeviceToDevice", kGpu0, kGpu0, true, 1},
                      PathCase{"Gpu0ToGpu1", kGpu0, kGpu1, true, 2},
                      PathCase{"PageableHostToDevice", kHostLoc, kGpu0, false, 1},
                      PathCase{"DeviceToPageableHost", kGpu0, kHostLoc, false, 1}),
    [](const ::testing::TestParamInfo<PathCase>& info) { return std::string(info.param.name); });

TEST(CudaPath, DeadlinePassesWhileTheCopyRunsAndTheCopyStillCompletes) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const size_t kBytes = 256 << 20;
  auto p = Pair::Make(kGpu0, kHostLoc, kBytes);
  ASSERT_TRUE(p);
  auto data = RandomBytes(kBytes, 10);
  p->a_buf->Upload(data);
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kBytes / 32768; ++i) ops.push_back({i * 32768, i * 32768, 32768});
  TransferOptions options;
  options.deadline = std::chrono::nanoseconds(1);
  Transfer t = p->session.WriteBatch(ops, options);
  EXPECT_EQ(t.Wait().code(), Code::kDeadlineExceeded);
  // Nobody polls any more: the engine's completer must still release the regions.
  EXPECT_TRUE(p->b->DeregisterMemory(p->b_desc).ok());
  EXPECT_TRUE(p->a->DeregisterMemory(p->a_desc).ok());
  EXPECT_EQ(std::memcmp(p->b_buf->ptr(), data.data(), kBytes), 0);
}

TEST(CudaPath, CompletesWithoutPolling) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto p = Pair::Make(kHostLoc, kGpu0, 8 << 20);
  ASSERT_TRUE(p);
  Transfer t = p->session.WriteBatch(Scattered(8 << 20, 2000, 4000, 11));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (t.status().code() == Code::kInProgress && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // status() never polls
  EXPECT_TRUE(t.status().ok()) << t.status().ToString();
}

TEST(CudaPath, NotificationFollowsTheDataOfACudaWriteBatch) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const size_t kBytes = 32 << 20;
  for (Loc a : {kGpu0, kHostLoc}) {
    auto p = Pair::Make(a, kGpu0, kBytes);
    ASSERT_TRUE(p);
    auto data = RandomBytes(kBytes, 12);
    p->a_buf->Upload(data);
    auto ops = Scattered(kBytes, 8192, 4096, 13);
    TransferOptions options;
    options.notification = "layer 7 ready";
    Transfer t = p->session.WriteBatch(ops, options);
    // The receiver waits for the notification only, then reads the data at once.
    std::vector<Notification> got;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got.empty() && std::chrono::steady_clock::now() < until) got = p->b->PopNotifications();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].message, "layer 7 ready");
    EXPECT_EQ(got[0].from, p->a->key());
    ExpectApplied(data, p->b_buf->Download(), ops, true);
    EXPECT_TRUE(t.Wait().ok());
  }
}

TEST(CudaPath, ManyPostersAtOnce) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const size_t kBytes = 64 << 20;
  const int kThreads = 6;
  auto p = Pair::Make(kHostLoc, kGpu0, kBytes);
  ASSERT_TRUE(p);
  auto data = RandomBytes(kBytes, 14);
  p->a_buf->Upload(data);
  // Each thread owns a disjoint stripe of both regions and posts batches into it.
  const size_t stripe = kBytes / kThreads;
  std::vector<std::vector<TransferOp>> all(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        auto ops = Scattered(stripe / 20, 1500, 700, 100 * t + round);
        for (auto& op : ops) {
          op.local_offset += t * stripe + round * (stripe / 20);
          op.remote_offset += t * stripe + round * (stripe / 20);
        }
        Transfer x = p->session.WriteBatch(ops);
        if (!x.Wait().ok()) failures.fetch_add(1);
        all[t].insert(all[t].end(), ops.begin(), ops.end());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto b = p->b_buf->Download();
  for (const auto& ops : all) ExpectApplied(data, b, ops, true);
}

TEST(CudaPath, EngineDestroyedWithCopiesInFlight) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto p = Pair::Make(kGpu0, kGpu0, 64 << 20);
  ASSERT_TRUE(p);
  Transfer t = p->session.WriteBatch(Scattered(64 << 20, 8192, 8192, 15));
  p->a.reset();  // waits for the regions' transfers, then stops the copy engines
  p->b.reset();
  Status s = t.Wait();
  EXPECT_TRUE(s.ok() || s.code() == Code::kAborted) << s.ToString();
  EXPECT_FALSE(p->session.Write(0, 0, 1).Wait().ok());
}

}  // namespace
}  // namespace ferry
