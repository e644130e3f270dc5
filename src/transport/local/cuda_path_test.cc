// The local transport's CUDA path, end to end through two engines of this process: host and
// device memory in every direction, single ops and batches of thousands of scattered pieces
// (random data, odd sizes, misaligned offsets), deadlines, notifications, many posters.
// Every test skips where no CUDA device is usable. A disabled test measures bandwidth:
//   cuda_path_test --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*'
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "cuda/copy_engine.h"
#include "cuda/runtime.h"
#include "engine/test_util.h"
#include "ferry/system.h"

namespace ferry {
namespace {

using testing::RandomBytes;

struct Loc {
  MemoryKind kind;
  int device;  // -1 for host memory
};
constexpr Loc kHostLoc{MemoryKind::kHost, -1};
constexpr Loc kGpu0{MemoryKind::kCuda, 0};
constexpr Loc kGpu1{MemoryKind::kCuda, 1};

// Host memory (16-byte aligned by new[]) or memory of one CUDA device.
class Buffer {
 public:
  static std::unique_ptr<Buffer> Make(Loc loc, size_t size) {
    auto b = std::unique_ptr<Buffer>(new Buffer(loc, size));
    if (loc.kind == MemoryKind::kHost) {
      b->host_.reset(new uint8_t[size]());
      b->ptr_ = b->host_.get();
    } else {
      auto p = cuda::Malloc(loc.device, size);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return nullptr;
      b->ptr_ = *p;
      EXPECT_TRUE(cuda::MemsetSync(b->ptr_, 0, size).ok());
    }
    return b;
  }
  ~Buffer() {
    if (loc_.kind == MemoryKind::kCuda && ptr_ != nullptr) (void)cuda::Free(ptr_);
  }
  void Upload(const std::vector<uint8_t>& data) {
    ASSERT_EQ(data.size(), size_);
    ASSERT_TRUE(cuda::CopySync(ptr_, data.data(), size_).ok());
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(size_);
    EXPECT_TRUE(cuda::CopySync(out.data(), ptr_, size_).ok());
    return out;
  }
  void* ptr() const { return ptr_; }
  size_t size() const { return size_; }
  Loc loc() const { return loc_; }

 private:
  Buffer(Loc loc, size_t size) : loc_(loc), size_(size) {}
  Loc loc_;
  size_t size_;
  void* ptr_ = nullptr;
  std::unique_ptr<uint8_t[]> host_;
};

// Engines a and b (local transport only), a buffer registered with each, and a session from
// a's buffer to b's. Buffers are declared first so that they outlive the engines.
struct Pair {
  std::unique_ptr<Buffer> a_buf, b_buf;
  std::unique_ptr<Engine> a, b;
  MemoryDesc a_desc, b_desc;
  Session session;

  static std::unique_ptr<Pair> Make(Loc a_loc, Loc b_loc, size_t bytes, EngineOptions options = {}) {
    static std::atomic<int> counter{0};
    auto p = std::make_unique<Pair>();
    const std::string suffix = std::to_string(counter.fetch_add(1));
    options.transports = {"local"};
    options.key = "cuda-a" + suffix;
    auto a = Engine::Create(options);
    options.key = "cuda-b" + suffix;
    auto b = Engine::Create(options);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    p->a_buf = Buffer::Make(a_loc, bytes);
    p->b_buf = Buffer::Make(b_loc, bytes);
    if (!p->a_buf || !p->b_buf) return nullptr;
    p->a = std::move(a).value();
    p->b = std::move(b).value();
    auto ad = p->a->RegisterMemory(p->a_buf->ptr(), bytes, a_loc.kind, a_loc.device);
    auto bd = p->b->RegisterMemory(p->b_buf->ptr(), bytes, b_loc.kind, b_loc.device);
    EXPECT_TRUE(ad.ok()) << ad.status().ToString();
    EXPECT_TRUE(bd.ok()) << bd.status().ToString();
    if (!ad.ok() || !bd.ok()) return nullptr;
    p->a_desc = *ad;
    p->b_desc = *bd;
    EXPECT_TRUE(p->a->AddPeer(p->b->Describe()).ok());
    EXPECT_TRUE(p->b->AddPeer(p->a->Describe()).ok());
    auto s = p->a->OpenSession(p->a_desc, p->b_desc);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    p->session = *s;
    EXPECT_EQ(p->session.path().transport, "local");
    return p;
  }
};

// `count` pieces of 1..max_piece bytes at random (so mostly misaligned) offsets, one per slot
// on each side, the remote slots shuffled; no two pieces overlap on either side.
std::vector<TransferOp> Scattered(size_t region, size_t count, size_t max_piece, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t slot = region / count;
  std::vector<size_t> remote_slots(count);
  std::iota(remote_slots.begin(), remote_slots.end(), 0);
  std::shuffle(remote_slots.begin(), remote_slots.end(), rng);
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t size = 1 + rng() % std::min(max_piece, slot);
    ops.push_back({i * slot + rng() % (slot - size + 1), remote_slots[i] * slot + rng() % (slot - size + 1), size});
  }
  return ops;
}

// Checks that every op moved its bytes from `src` to `dst` (write: local -> remote).
void ExpectApplied(const std::vector<uint8_t>& src, const std::vector<uint8_t>& dst,
                   const std::vector<TransferOp>& ops, bool write) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const TransferOp& op = ops[i];
    const uint64_t s = write ? op.local_offset : op.remote_offset;
    const uint64_t d = write ? op.remote_offset : op.local_offset;
    ASSERT_EQ(std::memcmp(src.data() + s, dst.data() + d, op.size), 0)
        << "op " << i << " (" << op.local_offset << ", " << op.remote_offset << ", " << op.size << ")";
  }
}

bool SkipWithoutCuda(int gpus, std::string* why) {
  if (!CudaAvailable(why)) return true;
  if (cuda::DeviceCount() < gpus) {
    *why = "needs " + std::to_string(gpus) + " CUDA devices, found " + std::to_string(cuda::DeviceCount());
    return true;
  }
  return false;
}

#define FERRY_SKIP_WITHOUT_CUDA(gpus)                   \
  do {                                                  \
    std::string why_;                                   \
    if (SkipWithoutCuda(gpus, &why_)) GTEST_SKIP() << why_; \
  } while (0)

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
