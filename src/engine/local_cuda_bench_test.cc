// A disabled test that measures the local transport's CUDA bandwidth through two engines of
// this process, against the copy engine alone and one cudaMemcpy:
//   local_cuda_test --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*'
#include <chrono>
#include <cstdio>

#include "testing/cuda_engine_pair.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers

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
