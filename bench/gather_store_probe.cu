// gather_store_probe: how the CPU path of one embedding step (8192 tokens x 16 random rows of
// 320 bytes from a 32 GB host table, 42 MB) writes its staging, and what each way costs the
// gather and the DMA engine's copies of the staging beside it. The gather loop is the
// embedding service's (embed::GatherRows: each thread prefetches the rows `kAhead` ahead of
// the one it copies; chunks of 32 tokens claimed from a cursor); only the stores and the
// prefetch hint vary:
//   memcpy   ordinary stores (the in-process Gatherer's default);
//   nt16     non-temporal 16-byte stores (the service's staging today);
//   nt32     non-temporal 32-byte stores (AVX2);
//   nt64     non-temporal 64-byte stores (AVX-512), where the CPU has them;
//   demote   ordinary stores, then CLDEMOTE of each line (to the shared cache, where the DMA
//            engine's reads find it without a snoop of a core's own cache), where the CPU has it.
// Two measures per variant, alternated over rounds: the gather alone, and the step as the
// service runs it (a pump issues one cudaMemcpyAsync for each run of finished chunks of 1 MiB
// or more; the step ends when the last copy is done). Baselines in the same run: the pinned
// copy of the step's bytes alone; the host's streaming read and write rates, alone and beside
// a bulk copy to the GPU. Fresh random ids every step; the copied bytes are checked.
//
// A probe, not part of the build (results in bench/results/embed_service.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/gather_store_probe bench/gather_store_probe.cu -lpthread
//   /tmp/gather_store_probe [table GiB=32] [gather threads=15] [rounds=3]
#include <cpuid.h>
#include <cuda_runtime.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "probe_util.cuh"


constexpr int kRowBytes = 320, kHeads = 16, kTokens = 8192, kChunkTokens = 32, kAhead = 32;
constexpr size_t kTokenBytes = size_t(kHeads) * kRowBytes;  // 5120
constexpr size_t kStepBytes = kTokens * kTokenBytes;       // 41.9 MB
constexpr size_t kMinCopy = 1 << 20;
constexpr int kSteps = 20;
constexpr int kChunks = kTokens / kChunkTokens;

enum Store { kMemcpy, kNt16, kNt32, kNt64, kDemote };
const char* kStoreName[] = {"memcpy", "nt16", "nt32", "nt64", "demote"};
enum Hint { kNta, kT0 };

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

__attribute__((target("avx2"))) void CopyNt32(char* dst, const char* src) {
  for (int o = 0; o < kRowBytes; o += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + o), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + o)));
}
__attribute__((target("avx512f"))) void CopyNt64(char* dst, const char* src) {
  for (int o = 0; o < kRowBytes; o += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + o), _mm512_loadu_si512(src + o));
}
void CopyNt16(char* dst, const char* src) {
  for (int o = 0; o < kRowBytes; o += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + o), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + o)));
}
void CopyDemote(char* dst, const char* src) {
  std::memcpy(dst, src, kRowBytes);
  for (int o = 0; o < kRowBytes; o += 64) asm volatile("cldemote (%0)" ::"r"(dst + o) : "memory");
}

template <Store S, Hint H>
void GatherChunk(const char* table, const uint64_t* ids, int c, char* staging) {
  const int64_t first = int64_t(c) * kChunkTokens * kHeads, count = int64_t(kChunkTokens) * kHeads;
  auto prefetch = [&](uint64_t r) {
    const char* p = table + r * kRowBytes;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}, e = reinterpret_cast<uintptr_t>(p) + kRowBytes - 1;
    for (uintptr_t l = a; l <= e; l += 64) __builtin_prefetch(reinterpret_cast<const void*>(l), 0, H == kNta ? 0 : 3);
  };
  for (int i = 0; i < kAhead; ++i) prefetch(ids[first + i]);
  char* dst = staging + first * kRowBytes;
  for (int64_t i = 0; i < count; ++i, dst += kRowBytes) {
    if (i + kAhead < count) prefetch(ids[first + i + kAhead]);
    const char* src = table + ids[first + i] * kRowBytes;
    if constexpr (S == kMemcpy) std::memcpy(dst, src, kRowBytes);
    if constexpr (S == kNt16) CopyNt16(dst, src);
    if constexpr (S == kNt32) CopyNt32(dst, src);
    if constexpr (S == kNt64) CopyNt64(dst, src);
    if constexpr (S == kDemote) CopyDemote(dst, src);
  }
  if constexpr (S != kMemcpy && S != kDemote) _mm_sfence();
}

using ChunkFn = void (*)(const char*, const uint64_t*, int, char*);
ChunkFn Pick(Store s, Hint h) {
  static const ChunkFn fns[5][2] = {
      {GatherChunk<kMemcpy, kNta>, GatherChunk<kMemcpy, kT0>}, {GatherChunk<kNt16, kNta>, GatherChunk<kNt16, kT0>},
      {GatherChunk<kNt32, kNta>, GatherChunk<kNt32, kT0>},     {GatherChunk<kNt64, kNta>, GatherChunk<kNt64, kT0>},
      {GatherChunk<kDemote, kNta>, GatherChunk<kDemote, kT0>}};
  return fns[s][h];
}

// Spinning workers (the probe measures memory, not wake-ups).
struct Pool {
  const char* table = nullptr;
  char* staging = nullptr;
  const uint64_t* ids = nullptr;
  ChunkFn fn = nullptr;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> next{kChunks};
  std::atomic<int> active{0};
  std::atomic<bool> stop{false};
  std::vector<std::atomic<int>> ready = std::vector<std::atomic<int>>(kChunks);
  std::vector<std::thread> threads;
  void Work() {
    for (;;) {
      const int c = next.fetch_add(1, std::memory_order_acq_rel);
      if (c >= kChunks) break;
      fn(table, ids, c, staging);
      ready[c].store(1, std::memory_order_release);
    }
  }
  void Start(int n) {
    for (int i = 0; i < n; ++i)
      threads.emplace_back([this] {
        uint64_t seen = 0;
        while (!stop.load(std::memory_order_acquire)) {
          const uint64_t g = generation.load(std::memory_order_acquire);
          if (g == seen) {
            _mm_pause();
            continue;
          }
          seen = g;
          active.fetch_add(1, std::memory_order_acq_rel);
          Work();
          active.fetch_sub(1, std::memory_order_acq_rel);
        }
      });
  }
  void Begin(const uint64_t* step_ids, ChunkFn f) {
    while (active.load(std::memory_order_acquire) != 0) _mm_pause();
    ids = step_ids;
    fn = f;
    for (auto& r : ready) r.store(0, std::memory_order_relaxed);
    next.store(0, std::memory_order_release);
    generation.fetch_add(1, std::memory_order_acq_rel);
  }
  ~Pool() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

bool Has(const char* flag) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const std::string f = flag;
  if (f == "cldemote") return c >> 25 & 1;
  if (f == "avx512f") return b >> 16 & 1;
  return b >> 5 & 1;  // avx2
}

// GB/s of `threads` threads streaming over `bytes` (read: sum of loads; write: NT stores).
double HostRate(char* buf, size_t bytes, int threads, bool write) {
  std::vector<std::thread> ts;
  std::atomic<uint64_t> sink{0};
  const auto a = Clock::now();
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      const size_t lo = bytes / threads * i, hi = bytes / threads * (i + 1);
      if (write) {
        const __m128i v = _mm_set1_epi32(i);
        for (size_t o = lo; o < hi; o += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(buf + o), v);
        _mm_sfence();
      } else {
        uint64_t s = 0;
        for (size_t o = lo; o < hi; o += 64) s += *reinterpret_cast<const uint64_t*>(buf + o);
        sink += s;
      }
    });
  for (auto& t : ts) t.join();
  return bytes / 1e9 / (Ms(a, Clock::now()) / 1e3);
}

int main(int argc, char** argv) {
  const size_t table_bytes = size_t(argc > 1 ? std::atol(argv[1]) : 32) << 30;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 15;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const uint64_t rows = table_bytes / kRowBytes;
  {
    char brand[49] = {};
    unsigned* w = reinterpret_cast<unsigned*>(brand);
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002 + i, &w[4 * i], &w[4 * i + 1], &w[4 * i + 2], &w[4 * i + 3]);
    std::printf("cpu: %s; %u threads; avx2 %d avx512f %d cldemote %d\n", brand, std::thread::hardware_concurrency(),
                Has("avx2"), Has("avx512f"), Has("cldemote"));
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  auto t0 = Clock::now();
  char* table = MakeTable(table_bytes, kRowBytes);
  if (table == nullptr) return std::printf("mmap failed\n"), 1;
  std::printf("table %zu GiB filled in %.1f s\n", table_bytes >> 30, Ms(t0, Clock::now()) / 1e3);

  char* staging;
  CK(cudaHostAlloc(&staging, kStepBytes, cudaHostAllocDefault));
  std::memset(staging, 1, kStepBytes);
  char *out, *bulk_dev;
  CK(cudaMalloc(&out, kStepBytes));
  cudaStream_t ds, bs;
  CK(cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&bs, cudaStreamNonBlocking));
  cudaEvent_t done;
  CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

  // Host memory: streaming read and write of 4 GiB by 16 threads, alone and beside a bulk copy.
  {
    const size_t hb = size_t(4) << 30, bulk = size_t(1) << 30;
    char* h = static_cast<char*>(std::aligned_alloc(4096, hb));
    std::memset(h, 0, hb);
    char* pinned;
    CK(cudaHostAlloc(&pinned, bulk, cudaHostAllocDefault));
    std::memset(pinned, 0, bulk);
    CK(cudaMalloc(&bulk_dev, bulk));
    const int n = std::thread::hardware_concurrency();
    auto copy_rate = [&](auto&& beside) {
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      CK(cudaEventRecord(a, bs));
      for (int i = 0; i < 4; ++i) CK(cudaMemcpyAsync(bulk_dev, pinned, bulk, cudaMemcpyHostToDevice, bs));
      CK(cudaEventRecord(b, bs));
      double r = beside();
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      return std::make_pair(4 * bulk / 1e9 / (ms / 1e3), r);
    };
    auto none = [] { return 0.0; };
    for (int rep = 0; rep < 2; ++rep) {
      double rd = HostRate(h, hb, n, false), wr = HostRate(h, hb, n, true);
      auto [c0, x0] = copy_rate(none);
      auto [c1, rd1] = copy_rate([&] { return HostRate(h, hb, n, false); });
      auto [c2, wr2] = copy_rate([&] { return HostRate(h, hb, n, true); });
      (void)x0;
      std::printf("host memory, %d threads: read %.1f GB/s, NT write %.1f GB/s | bulk H2D copy alone %.1f GB/s | "
                  "read %.1f beside copy at %.1f | NT write %.1f beside copy at %.1f\n",
                  n, rd, wr, c0, rd1, c1, wr2, c2);
    }
    CK(cudaFreeHost(pinned));
    std::free(h);
  }

  std::mt19937_64 rng(42);
  std::vector<std::vector<uint64_t>> ids(kSteps + 1, std::vector<uint64_t>(size_t(kTokens) * kHeads));
  for (auto& s : ids)
    for (auto& x : s) x = rng() % rows;

  std::vector<char> check(kStepBytes);
  Pool pool;
  pool.table = table;
  pool.staging = staging;
  pool.Start(threads);
  std::vector<Store> stores = {kMemcpy, kNt16, kNt32};
  if (Has("avx512f")) stores.push_back(kNt64);
  if (Has("cldemote")) stores.push_back(kDemote);
  std::printf("\nstep %.1f MB, %d gather threads (spinning), chunks of %d tokens, prefetch %d rows ahead, copies >= 1 MiB\n",
              kStepBytes / 1e6, threads, kChunkTokens, kAhead);
  std::printf("| round | stores | prefetch | gather alone ms | step ms (gather + copies) | pinned copy alone ms | step / copy |\n");
  std::printf("| ---: | --- | --- | ---: | ---: | ---: | ---: |\n");
  for (int round = 1; round <= rounds; ++round) {
    // Baseline of this round: the pinned copy of the step's bytes alone.
    std::vector<double> base;
    for (int s = 0; s < kSteps; ++s) {
      const auto a = Clock::now();
      CK(cudaMemcpyAsync(out, staging, kStepBytes, cudaMemcpyHostToDevice, ds));
      CK(cudaStreamSynchronize(ds));
      base.push_back(Ms(a, Clock::now()));
    }
    std::sort(base.begin(), base.end());
    const double copy_ms = base[kSteps / 2];
    for (Store st : stores)
      for (Hint hint : {kNta, kT0}) {
        const ChunkFn fn = Pick(st, hint);
        std::vector<double> alone, step;
        for (int s = 0; s <= kSteps; ++s) {
          auto a = Clock::now();
          pool.Begin(ids[s].data(), fn);
          for (int c = 0; c < kChunks; ++c)
            while (!pool.ready[c].load(std::memory_order_acquire)) _mm_pause();
          if (s > 0) alone.push_back(Ms(a, Clock::now()));
        }
        for (int s = 0; s <= kSteps; ++s) {
          CK(cudaMemsetAsync(out, 0, kStepBytes, ds));
          CK(cudaStreamSynchronize(ds));
          const auto a = Clock::now();
          pool.Begin(ids[s].data(), fn);
          int issued = 0;
          while (issued < kChunks) {
            int end = issued;
            while (end < kChunks && pool.ready[end].load(std::memory_order_acquire)) ++end;
            if (end == kChunks || size_t(end - issued) * kChunkTokens * kTokenBytes >= kMinCopy) {
              const size_t off = size_t(issued) * kChunkTokens * kTokenBytes;
              CK(cudaMemcpyAsync(out + off, staging + off, size_t(end - issued) * kChunkTokens * kTokenBytes,
                                 cudaMemcpyHostToDevice, ds));
              issued = end;
            } else {
              _mm_pause();
            }
          }
          CK(cudaEventRecord(done, ds));
          while (cudaEventQuery(done) == cudaErrorNotReady) _mm_pause();
          if (s > 0) step.push_back(Ms(a, Clock::now()));
          if (s == kSteps) {
            CK(cudaMemcpy(check.data(), out, kStepBytes, cudaMemcpyDeviceToHost));
            for (int t = 0; t < kTokens; ++t)
              for (int h = 0; h < kHeads; ++h) {
                const uint32_t* w = reinterpret_cast<const uint32_t*>(check.data() + t * kTokenBytes + h * kRowBytes);
                const uint64_t r = ids[s][size_t(t) * kHeads + h];
                if (w[0] != static_cast<uint32_t>(r * 131) || w[79] != static_cast<uint32_t>(r * 131 + 79)) {
                  std::printf("MISMATCH %s token %d row %d\n", kStoreName[st], t, h);
                  return 1;
                }
              }
          }
        }
        std::sort(alone.begin(), alone.end());
        std::sort(step.begin(), step.end());
        std::printf("| %d | %s | %s | %.3f | %.3f | %.3f | %.2f |\n", round, kStoreName[st], hint == kNta ? "nta" : "t0",
                    alone[kSteps / 2], step[kSteps / 2], copy_ms, step[kSteps / 2] / copy_ms);
        std::fflush(stdout);
      }
  }
  return 0;
}
