// embed_split_probe: one embedding step's rows (8192 tokens x 16 random rows of 320 bytes from
// a 32 GB host table, 42 MB) reach a GPU buffer by two paths that use different resources:
//  - the CPU path (as ferry's embedding service): gather threads copy rows with non-temporal
//    stores into page-locked staging, chunk by chunk, and one pump thread copies each finished
//    chunk to the GPU (cudaMemcpyAsync) while the rest is gathered;
//  - the UVA path: a GPU kernel reads the rows from the registered table over PCIe itself.
// The CPU path is held by host memory (the gather's reads and stores beside the DMA engine's
// reads); the UVA path by translations of random host pages. This probe asks whether giving a
// share of the tokens to the kernel, running beside the CPU path, shortens the step. Baseline
// in the same run: one pinned host -> GPU copy of the step's 42 MB. Wall time from the step's
// start to both paths done; median of the steps; fresh random ids every step; bytes checked.
//
// A probe, not part of the build (results in bench/results/embed_service.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/embed_split_probe bench/embed_split_probe.cu -lpthread
//   /tmp/embed_split_probe [table GiB=32] [gather threads=12,15]
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
#include <thread>
#include <vector>

#include "probe_util.cuh"


constexpr int kRowBytes = 320, kRowWords = kRowBytes / 16, kHeads = 16;
constexpr int kTokens = 8192;
constexpr size_t kTokenBytes = size_t(kHeads) * kRowBytes;  // 5120
constexpr size_t kStepBytes = kTokens * kTokenBytes;       // 41.9 MB
constexpr int kChunkTokens = 256;                          // 1.25 MiB chunks
constexpr int kSteps = 30;

// One warp per token: all of its 16 rows' words loaded before any store.
__global__ void Gather(const uint4* table, const uint64_t* ids, uint4* out, int tokens) {
  const int lane = threadIdx.x % 32;
  const int token = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (token >= tokens) return;
  const uint64_t* tid = ids + size_t(token) * kHeads;
  uint4 v[10];
#pragma unroll
  for (int u = 0; u < 10; ++u) {
    const int k = u * 32 + lane;
    const int h = k / kRowWords;
    v[u] = table[tid[h] * kRowWords + (k - h * kRowWords)];
  }
#pragma unroll
  for (int u = 0; u < 10; ++u) out[size_t(token) * kHeads * kRowWords + u * 32 + lane] = v[u];
}

struct Step {
  const uint64_t* ids = nullptr;  // host, kTokens * kHeads
  int first_cpu_token = 0;        // tokens [0, first) go to the kernel
};

// Gather threads claim chunks of the step's CPU tokens; `ready[c]` says chunk c is in staging.
struct Pool {
  const char* table = nullptr;
  char* staging = nullptr;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> next{1 << 30};  // past every chunk between steps
  std::atomic<int> active{0};       // threads inside Work
  std::atomic<bool> stop{false};
  Step step;
  std::atomic<int> chunks{0};
  std::vector<std::atomic<int>> ready = std::vector<std::atomic<int>>(kTokens / kChunkTokens + 1);
  std::vector<std::thread> threads;

  // Gathers chunks until none is left, or `most` of them.
  void Work(int most = 1 << 30) {
    active.fetch_add(1, std::memory_order_acq_rel);
    for (int done = 0; done < most; ++done) {
      const int c = next.fetch_add(1, std::memory_order_acq_rel);
      if (c >= chunks.load(std::memory_order_acquire)) break;
      const int t0 = step.first_cpu_token + c * kChunkTokens;
      const int t1 = std::min(kTokens, t0 + kChunkTokens);
      for (int t = t0; t < t1; ++t) {
        __m128i* out = reinterpret_cast<__m128i*>(staging + size_t(t) * kTokenBytes);
        for (int h = 0; h < kHeads; ++h) {
          const __m128i* row = reinterpret_cast<const __m128i*>(table + step.ids[size_t(t) * kHeads + h] * kRowBytes);
          for (int w = 0; w < kRowWords; ++w) _mm_stream_si128(out + h * kRowWords + w, _mm_loadu_si128(row + w));
        }
      }
      _mm_sfence();
      ready[c].store(1, std::memory_order_release);
    }
    active.fetch_sub(1, std::memory_order_acq_rel);
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
          Work();
        }
      });
  }
  ~Pool() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

int main(int argc, char** argv) {
  const size_t table_bytes = size_t(argc > 1 ? std::atol(argv[1]) : 32) << 30;
  std::vector<int> thread_counts = {12, 15};
  if (argc > 2) thread_counts = {std::atoi(argv[2])};
  const uint64_t rows = table_bytes / kRowBytes;
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));

  auto t0 = std::chrono::steady_clock::now();
  char* table = MakeTable(table_bytes, kRowBytes);
  if (table == nullptr) return std::printf("mmap failed\n"), 1;
  CK(cudaHostRegister(table, table_bytes, cudaHostRegisterMapped));
  std::printf("table %zu GiB, filled and registered in %.1f s; %u host threads\n", table_bytes >> 30,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              std::thread::hardware_concurrency());

  char* staging;
  CK(cudaHostAlloc(&staging, kStepBytes, cudaHostAllocDefault));
  std::memset(staging, 1, kStepBytes);
  char* out;
  CK(cudaMalloc(&out, kStepBytes));
  cudaStream_t ks, ds;
  CK(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking));

  // Ids of every step, on the host and on the GPU.
  std::mt19937_64 rng(42);
  std::vector<std::vector<uint64_t>> ids(kSteps + 1, std::vector<uint64_t>(size_t(kTokens) * kHeads));
  std::vector<uint64_t*> dids(kSteps + 1);
  for (int s = 0; s <= kSteps; ++s) {
    for (auto& x : ids[s]) x = rng() % rows;
    CK(cudaMalloc(&dids[s], ids[s].size() * 8));
    CK(cudaMemcpy(dids[s], ids[s].data(), ids[s].size() * 8, cudaMemcpyHostToDevice));
  }

  // Baseline: the pinned copy of the step's bytes, alone.
  {
    std::vector<double> ms;
    for (int s = 0; s < kSteps; ++s) {
      const auto a = std::chrono::steady_clock::now();
      CK(cudaMemcpyAsync(out, staging, kStepBytes, cudaMemcpyHostToDevice, ds));
      CK(cudaStreamSynchronize(ds));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("pinned copy of %.1f MB alone: %.3f ms (median), %.3f (min)\n", kStepBytes / 1e6, ms[kSteps / 2], ms[0]);
  }
  std::vector<char> check(kStepBytes);
  for (int threads : thread_counts) {
    Pool pool;
    pool.table = table;
    pool.staging = staging;
    pool.Start(threads - 1);  // the calling thread is the pump and gathers too
    for (double share : {0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1.0}) {
      const int gpu_tokens = std::min(kTokens, static_cast<int>(share * kTokens + 0.5) / kChunkTokens * kChunkTokens);
      std::vector<double> ms;
      for (int s = 0; s <= kSteps; ++s) {
        CK(cudaMemsetAsync(out, 0, kStepBytes, ds));
        CK(cudaStreamSynchronize(ds));
        const auto a = std::chrono::steady_clock::now();
        if (gpu_tokens > 0) {
          const int tpb = 128, blocks = (gpu_tokens * 32 + tpb - 1) / tpb;
          Gather<<<blocks, tpb, 0, ks>>>(reinterpret_cast<const uint4*>(table), dids[s],
                                         reinterpret_cast<uint4*>(out), gpu_tokens);
          CK(cudaGetLastError());
        }
        const int cpu_tokens = kTokens - gpu_tokens;
        const int chunks = (cpu_tokens + kChunkTokens - 1) / kChunkTokens;
        if (chunks > 0) {
          while (pool.active.load(std::memory_order_acquire) != 0) _mm_pause();
          pool.step = Step{ids[s].data(), gpu_tokens};
          pool.chunks = chunks;
          for (int c = 0; c < chunks; ++c) pool.ready[c].store(0, std::memory_order_relaxed);
          pool.next.store(0, std::memory_order_release);
          pool.generation.fetch_add(1, std::memory_order_acq_rel);
          // Pump: copy each chunk once ready, in order; gather when the next is not ready yet.
          for (int c = 0; c < chunks; ++c) {
            while (!pool.ready[c].load(std::memory_order_acquire)) {
              const int mine = pool.next.load(std::memory_order_acquire);
              if (mine < chunks) pool.Work(1);  // one chunk, then look again
              else _mm_pause();
            }
            const size_t off = (size_t(gpu_tokens) + size_t(c) * kChunkTokens) * kTokenBytes;
            const size_t len = std::min<size_t>(kChunkTokens, cpu_tokens - c * kChunkTokens) * kTokenBytes;
            CK(cudaMemcpyAsync(out + off, staging + off, len, cudaMemcpyHostToDevice, ds));
          }
          pool.next.store(1 << 30, std::memory_order_release);
        }
        CK(cudaStreamSynchronize(ds));
        CK(cudaStreamSynchronize(ks));
        const auto b = std::chrono::steady_clock::now();
        if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
        if (s == kSteps) {  // check the last step's bytes
          CK(cudaMemcpy(check.data(), out, kStepBytes, cudaMemcpyDeviceToHost));
          for (int t = 0; t < kTokens; t += 7)
            for (int h = 0; h < kHeads; ++h) {
              const uint32_t* w = reinterpret_cast<const uint32_t*>(check.data() + t * kTokenBytes + h * kRowBytes);
              const uint64_t r = ids[s][size_t(t) * kHeads + h];
              if (w[0] != static_cast<uint32_t>(r * 131) || w[79] != static_cast<uint32_t>(r * 131 + 79)) {
                std::printf("MISMATCH token %d row %d\n", t, h);
                return 1;
              }
            }
        }
      }
      std::sort(ms.begin(), ms.end());
      std::printf("threads %2d  kernel share %.2f (%4d tokens): step %.3f ms (median), %.3f (min)\n", threads,
                  double(gpu_tokens) / kTokens, gpu_tokens, ms[ms.size() / 2], ms[0]);
    }
  }
  return 0;
}
