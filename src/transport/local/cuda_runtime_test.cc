// The CUDA runtime seam and the copy engine directly, and a disabled test that measures the
// local transport's CUDA bandwidth:
//   cuda_runtime_test --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*'
#include "testing/cuda_engine_pair.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers

#if FERRY_HAVE_CUDA
TEST(CudaRuntime, RegistrationAndPointers) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  std::vector<uint8_t> host(1 << 20);
  ASSERT_TRUE(cuda::HostRegister(host.data(), host.size()).ok());
  EXPECT_EQ(cuda::HostRegister(host.data(), host.size()).code(), Code::kAlreadyExists);
  EXPECT_TRUE(cuda::IsMappedHost(host.data() + 4096, 0));
  EXPECT_TRUE(cuda::HostUnregister(host.data()).ok());
  EXPECT_EQ(cuda::HostUnregister(host.data()).code(), Code::kNotFound);
  EXPECT_FALSE(cuda::IsMappedHost(host.data(), 0));

  auto dev = cuda::Malloc(0, 4096);
  ASSERT_TRUE(dev.ok());
  auto info = cuda::QueryPointer(*dev);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->device_memory);
  EXPECT_EQ(info->device, 0);
  EXPECT_FALSE(cuda::QueryPointer(host.data())->device_memory);
  EXPECT_TRUE(cuda::Free(*dev).ok());
  EXPECT_FALSE(cuda::Devices().empty());
  EXPECT_EQ(cuda::Malloc(0, size_t{1} << 62).status().code(), Code::kResourceExhausted);
}

TEST(CudaRuntime, CopyEngineCompletesThroughCallbackAndTest) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto src = cuda::Malloc(0, 1 << 20);
  auto dst = cuda::Malloc(0, 1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto data = RandomBytes(1 << 20, 16);
  ASSERT_TRUE(cuda::CopySync(*src, data.data(), data.size()).ok());
  std::vector<cuda::Copy> copies;
  for (size_t i = 0; i < 256; ++i)
    copies.push_back({static_cast<char*>(*dst) + i * 4096, static_cast<char*>(*src) + (255 - i) * 4096, 4096});
  std::atomic<int> calls{0};
  cuda::PostOptions options;
  options.kernel_ok = true;
  options.on_done = [&](const Status& s) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    calls.fetch_add(1);
  };
  auto c = (*engine)->Post(copies, options);
  ASSERT_TRUE(c.ok());
  while (!(*c)->Test()) std::this_thread::yield();
  EXPECT_TRUE((*c)->status().ok());
  EXPECT_EQ(calls.load(), 1);
  std::vector<uint8_t> out(1 << 20);
  ASSERT_TRUE(cuda::CopySync(out.data(), *dst, out.size()).ok());
  for (size_t i = 0; i < 256; ++i)
    ASSERT_EQ(std::memcmp(out.data() + i * 4096, data.data() + (255 - i) * 4096, 4096), 0) << i;
  engine->reset();
  EXPECT_TRUE(cuda::Free(*src).ok());
  EXPECT_TRUE(cuda::Free(*dst).ok());
}

// The engine alternates a batch's launches between two streams: a batch posted after another
// must still land after it, whether the first went through several kernel launches or the DMA
// engines. Batch 2 rewrites the destination of batch 1's last pieces (those of its last launch)
// from another source; batch 2's bytes must be what stays.
TEST(CudaRuntime, BatchesLandInTheOrderPosted) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kPiece = 4096, kPieces = 40'000, kBytes = kPiece * kPieces;  // 5 launches
  auto a = cuda::Malloc(0, kBytes), b = cuda::Malloc(0, kBytes), dst = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(a.ok() && b.ok() && dst.ok());
  auto data_a = RandomBytes(kBytes, 1), data_b = RandomBytes(kBytes, 2);
  ASSERT_TRUE(cuda::CopySync(*a, data_a.data(), kBytes).ok());
  ASSERT_TRUE(cuda::CopySync(*b, data_b.data(), kBytes).ok());
  auto at = [](void* base, size_t i) { return static_cast<char*>(base) + i * kPiece; };
  cuda::PostOptions options;
  options.kernel_ok = true;
  for (int round = 0; round < 6; ++round) {
    // Round 0-1: batch 1 is kernel launches; round 2-3: a few 40 MB pieces on the DMA engines;
    // round 4-5: the same large pieces cut for the kernel (large_to_dma off, as for copies
    // within one device's memory).
    const bool dma_first = round >= 2;
    options.large_to_dma = round < 4;
    std::vector<cuda::Copy> first, second;
    if (dma_first) {
      for (size_t q = 0; q < 4; ++q)
        first.push_back({at(*dst, q * kPieces / 4), at(*a, q * kPieces / 4), kBytes / 4});
    } else {
      for (size_t i = 0; i < kPieces; ++i) first.push_back({at(*dst, i), at(*a, i), kPiece});
    }
    const size_t from = kPieces - 2000;  // inside batch 1's last launch, or its last DMA piece
    for (size_t i = from; i < kPieces; ++i) second.push_back({at(*dst, i), at(*b, i), kPiece});
    auto c1 = (*engine)->Post(first, options);
    auto c2 = (*engine)->Post(second, options);
    ASSERT_TRUE(c1.ok() && c2.ok());
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!((*c1)->Test() && (*c2)->Test()) && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    ASSERT_TRUE((*c1)->status().ok() && (*c2)->status().ok());
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(cuda::CopySync(out.data(), *dst, kBytes).ok());
    ASSERT_EQ(std::memcmp(out.data(), data_a.data(), from * kPiece), 0) << "round " << round;
    ASSERT_EQ(std::memcmp(out.data() + from * kPiece, data_b.data() + from * kPiece, (kPieces - from) * kPiece), 0)
        << "round " << round << ": batch 2 was overtaken by batch 1";
  }
  engine->reset();
  for (void* p : {*a, *b, *dst}) EXPECT_TRUE(cuda::Free(p).ok());
}

// No call per piece: a batch of small scattered pieces is a few kernel launches (the first of
// 2,048 pieces, each later one twice the last, at most a quarter of the descriptor ring), and
// pieces of 1 MiB or more go to the DMA engines in one batched call beside them.
TEST(CudaRuntime, ABatchIsAFewLaunchesAndOneDmaCall) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  auto engine = cuda::CopyEngine::Create(0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  constexpr size_t kPiece = 4096, kPieces = 80'000, kBig = 2 << 20, kBytes = kPiece * kPieces + 2 * kBig;
  auto src = cuda::Malloc(0, kBytes), dst = cuda::Malloc(0, kBytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto data = RandomBytes(kBytes, 5);
  ASSERT_TRUE(cuda::CopySync(*src, data.data(), kBytes).ok());
  auto at = [](void* base, size_t off) { return static_cast<char*>(base) + off; };
  std::vector<cuda::Copy> copies;
  for (size_t i = 0; i < kPieces; ++i)
    copies.push_back({at(*dst, (kPieces - 1 - i) * kPiece), at(*src, i * kPiece), kPiece});
  const size_t big = kPieces * kPiece;
  copies.push_back({at(*dst, big), at(*src, big + kBig), kBig});
  copies.push_back({at(*dst, big + kBig), at(*src, big), kBig});
  cuda::PostOptions options;
  options.kernel_ok = true;
  auto wait = [](const std::shared_ptr<cuda::Completion>& c) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!c->Test() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    return c->status();
  };
  auto c = (*engine)->Post(copies, options);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(wait(*c).ok());
  cuda::CopyStats s = (*engine)->stats();
  EXPECT_EQ(s.batches, 1u);
  // 2,048 + 4,096 + 8,192 + 16,384 + 32,768 + 16,512: six launches for 80,000 pieces.
  EXPECT_EQ(s.kernel_launches, 6u);
  EXPECT_EQ(s.kernel_pieces, kPieces);
  EXPECT_EQ(s.dma_calls, 1u);
  EXPECT_EQ(s.dma_copies, 2u);
  std::vector<uint8_t> out(kBytes);
  ASSERT_TRUE(cuda::CopySync(out.data(), *dst, kBytes).ok());
  for (size_t i = 0; i < kPieces; i += 997)
    ASSERT_EQ(std::memcmp(out.data() + (kPieces - 1 - i) * kPiece, data.data() + i * kPiece, kPiece), 0) << i;
  EXPECT_EQ(std::memcmp(out.data() + big, data.data() + big + kBig, kBig), 0);
  EXPECT_EQ(std::memcmp(out.data() + big + kBig, data.data() + big, kBig), 0);

  // A handful of pieces goes to the DMA engines whole (a launch would cost more).
  std::vector<cuda::Copy> few(copies.begin(), copies.begin() + 3);
  auto f = (*engine)->Post(few, options);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(wait(*f).ok());
  s = (*engine)->stats();
  EXPECT_EQ(s.kernel_launches, 6u);
  EXPECT_EQ(s.dma_calls, 2u);
  EXPECT_EQ(s.dma_copies, 5u);
  engine->reset();
  for (void* p : {*src, *dst}) EXPECT_TRUE(cuda::Free(p).ok());
}

#endif  // FERRY_HAVE_CUDA

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

// Bandwidth of scattered 32 KiB pieces through the local transport against one cudaMemcpy of
// the same total bytes (and against the same pieces through the DMA engines alone), and the
// latency of one small write. Prints a markdown table.
TEST(CudaPathBench, DISABLED_Bandwidth) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const uint64_t kPiece = 32 << 10, kCount = 8192, kBytes = kPiece * kCount;
  const int kWarm = 3, kIters = 20;
  struct Row {
    const char* name;
    Loc a, b;
    bool pin;
    int gpus;
  };
  const Row rows[] = {{"device -> device (GPU0)", kGpu0, kGpu0, true, 1},
                      {"GPU0 -> GPU1", kGpu0, kGpu1, true, 2},
                      {"device -> pinned host", kGpu0, kHostLoc, true, 1},
                      {"pinned host -> device", kHostLoc, kGpu0, true, 1},
                      {"device -> pageable host", kGpu0, kHostLoc, false, 1},
                      {"pageable host -> device", kHostLoc, kGpu0, false, 1}};
  std::vector<uint64_t> perm(kCount);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(17));
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kCount; ++i) ops.push_back({i * kPiece, perm[i] * kPiece, kPiece});
  using Clock = std::chrono::steady_clock;
  auto gbps = [&](auto&& fn) {
    for (int i = 0; i < kWarm; ++i) fn();
    auto t0 = Clock::now();
    for (int i = 0; i < kIters; ++i) fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    return kBytes * kIters / s / 1e9;
  };
  std::printf("\n%llu pieces of %llu KiB (%llu MiB), scattered; GB/s = 1e9 bytes copied per second\n\n",
              (unsigned long long)kCount, (unsigned long long)(kPiece >> 10), (unsigned long long)(kBytes >> 20));
  std::printf("| path | ferry WriteBatch, Test() loop | ferry WriteBatch, Wait() | CopyEngine, same pieces, kernel | CopyEngine, same pieces, DMA engines only | one cudaMemcpy | ferry / cudaMemcpy | WriteBatch() call, median (us) | one 4 KiB write, median (us) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  for (const Row& row : rows) {
    if (cuda::DeviceCount() < row.gpus) {
      std::printf("| %s | skipped: needs %d GPUs | | | | | | | |\n", row.name, row.gpus);
      continue;
    }
    EngineOptions options;
    options.pin_host_memory = row.pin;
    auto p = Pair::Make(row.a, row.b, kBytes, options);
    ASSERT_TRUE(p);
    p->a_buf->Upload(RandomBytes(kBytes, 18));
    Status failed;
    std::vector<double> post_us;
    double spin = gbps([&] {
      auto t0 = Clock::now();
      Transfer t = p->session.WriteBatch(ops);
      post_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      while (!t.Test()) {
      }
      if (!t.status().ok()) failed = t.status();
    });
    ASSERT_TRUE(failed.ok()) << failed.ToString();
    ExpectApplied(p->a_buf->Download(), p->b_buf->Download(), ops, true);
    double wait = gbps([&] {
      Status s = p->session.WriteBatch(ops).Wait();
      if (!s.ok()) failed = s;
    });
    ASSERT_TRUE(failed.ok()) << failed.ToString();
    // The same pieces straight to a CopyEngine of the reading device: kernel, then DMA only.
    auto engine = cuda::CopyEngine::Create(row.a.kind == MemoryKind::kCuda ? row.a.device : row.b.device);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    std::vector<cuda::Copy> copies;
    for (const auto& op : ops)
      copies.push_back({static_cast<char*>(p->b_buf->ptr()) + op.remote_offset,
                        static_cast<char*>(p->a_buf->ptr()) + op.local_offset, op.size});
    auto direct = [&](bool kernel) {
      return gbps([&] {
        cuda::PostOptions o;
        o.kernel_ok = kernel;
        auto c = (*engine)->Post(copies, o);
        if (!c.ok()) {
          failed = c.status();
          return;
        }
        while (!(*c)->Test()) {
        }
        if (!(*c)->status().ok()) failed = (*c)->status();
      });
    };
    char kernel[32] = "n/a (pageable)";
    if (row.pin) std::snprintf(kernel, sizeof(kernel), "%.1f", direct(true));
    double dma = direct(false);
    ASSERT_TRUE(failed.ok()) << failed.ToString();
    double memcpy = gbps([&] {
      Status s = cuda::CopySync(p->b_buf->ptr(), p->a_buf->ptr(), kBytes);
      if (!s.ok()) failed = s;
    });
    ASSERT_TRUE(failed.ok()) << failed.ToString();
    std::vector<double> lat;
    for (int i = 0; i < 200; ++i) {
      auto t0 = Clock::now();
      Transfer t = p->session.Write(0, 4096, 4096);
      while (!t.Test()) {
      }
      ASSERT_TRUE(t.status().ok());
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    post_us.erase(post_us.begin(), post_us.begin() + kWarm);
    std::printf("| %s | %.1f | %.1f | %s | %.1f | %.1f | %.2f | %.0f | %.1f |\n", row.name, spin, wait, kernel, dma,
                memcpy, spin / memcpy, median(post_us), median(lat));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace ferry
