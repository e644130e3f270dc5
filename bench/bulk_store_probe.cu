// GPU -> pinned host, a batch of scattered pieces: one warp per piece with 16-byte stores (as
// ferry's copy kernel) against bulk copies from shared memory (cp.async.bulk, sm_90) and
// against cudaMemcpyBatchAsync of the pieces dealt over 1-8 streams (the copy engines), against
// one 1 GiB cudaMemcpy. Prints GB/s (median of 7 launches) and checks the bytes. A probe, not
// part of the build (results in bench/results/cuda_ipc.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/bulk_store_probe bench/bulk_store_probe.cu && /tmp/bulk_store_probe [pieces]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

struct Piece { unsigned long long dst, src, size; };

__global__ void __launch_bounds__(256, 4) WarpCopy(const Piece* pieces, unsigned n) {
  const int lane = threadIdx.x % 32;
  const unsigned wpb = blockDim.x / 32, total = gridDim.x * wpb;
  for (unsigned p = blockIdx.x * wpb + threadIdx.x / 32; p < n; p += total) {
    const Piece pc = pieces[p];
    uint4* d = reinterpret_cast<uint4*>(pc.dst);
    const uint4* s = reinterpret_cast<const uint4*>(pc.src);
    const unsigned words = static_cast<unsigned>(pc.size / 16);
    unsigned i = lane;
    for (; i + 7 * 32 < words; i += 8 * 32) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = s[i + u * 32];
#pragma unroll
      for (int u = 0; u < 8; ++u) d[i + u * 32] = v[u];
    }
    for (; i < words; i += 32) d[i] = s[i];
  }
}

// One block per piece at a time; chunks of kChunk bytes staged in shared memory (double
// buffered) and written out by one bulk copy each.
template <int kChunk>
__global__ void __launch_bounds__(256) BulkCopy(const Piece* pieces, unsigned n) {
  extern __shared__ __align__(128) unsigned char smem[];
  int buf = 0;
  for (unsigned p = blockIdx.x; p < n; p += gridDim.x) {
    const Piece pc = pieces[p];
    for (unsigned long long off = 0; off < pc.size; off += kChunk) {
      const unsigned bytes = static_cast<unsigned>(min(static_cast<unsigned long long>(kChunk), pc.size - off));
      unsigned char* b = smem + buf * kChunk;
      if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      __syncthreads();
      const uint4* s = reinterpret_cast<const uint4*>(pc.src + off);
      uint4* t = reinterpret_cast<uint4*>(b);
      for (unsigned i = threadIdx.x; i < bytes / 16; i += blockDim.x) t[i] = s[i];
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (threadIdx.x == 0) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(pc.dst + off),
                     "r"(static_cast<unsigned>(__cvta_generic_to_shared(b))), "r"(bytes)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
      buf ^= 1;
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void Fill(unsigned* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<unsigned>(i * 2654435761u);
}

template <typename F>
double Median(F&& launch, cudaStream_t st, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  launch();  // warm-up
  CK(cudaStreamSynchronize(st));
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, st));
    launch();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] / 1e3;
}

int main(int argc, char** argv) {
  const unsigned n = argc > 1 ? std::atoi(argv[1]) : 80000;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t gib = size_t(1) << 30;
  for (size_t piece : {size_t(16) << 10, size_t(32) << 10, size_t(128) << 10}) {
    const size_t bytes = piece * n;
    const size_t alloc = std::max(bytes, gib);
    unsigned char *src, *host;
    CK(cudaMalloc(&src, alloc));
    CK(cudaHostAlloc(reinterpret_cast<void**>(&host), alloc, cudaHostAllocPortable | cudaHostAllocMapped));
    Fill<<<1024, 256, 0, st>>>(reinterpret_cast<unsigned*>(src), alloc / 4);
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned> slot(n);
    std::iota(slot.begin(), slot.end(), 0);
    std::mt19937_64 rng(42);
    std::shuffle(slot.begin(), slot.end(), rng);
    std::vector<Piece> ps(n);
    for (unsigned i = 0; i < n; ++i)
      ps[i] = {reinterpret_cast<unsigned long long>(host) + slot[i] * piece, reinterpret_cast<unsigned long long>(src) + i * piece, piece};
    Piece* dp;
    CK(cudaMalloc(&dp, n * sizeof(Piece)));
    CK(cudaMemcpy(dp, ps.data(), n * sizeof(Piece), cudaMemcpyHostToDevice));
    std::vector<unsigned char> expect(piece);
    auto check = [&](const char* what) {
      CK(cudaStreamSynchronize(st));
      for (unsigned i : {0u, 1u, n / 2, n - 1}) {
        CK(cudaMemcpy(expect.data(), src + size_t(i) * piece, piece, cudaMemcpyDeviceToHost));
        if (std::memcmp(expect.data(), host + size_t(slot[i]) * piece, piece) != 0) std::printf("  %s: piece %u WRONG\n", what, i);
      }
      std::memset(host, 0, bytes);
    };
    const int reps = 7;
    double base = Median([&] { CK(cudaMemcpyAsync(host, src, gib, cudaMemcpyDeviceToHost, st)); }, st, reps);
    std::printf("piece %zu KiB x %u: 1 GiB cudaMemcpy %.2f GB/s\n", piece >> 10, n, gib / base / 1e9);
    std::memset(host, 0, bytes);
    for (int bps : {1, 2, 4}) {
      double t = Median([&] { WarpCopy<<<sms * bps, 256, 0, st>>>(dp, n); }, st, reps);
      std::printf("  warp copy, %d blocks/SM: %.2f GB/s (%.3f of the 1 GiB copy)\n", bps, bytes / t / 1e9, (bytes / t) / (gib / base));
      check("warp");
    }
    auto bulk = [&](auto kernel, int chunk, const char* name) {
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * chunk));
      for (int bps : {2, 4, 6}) {
        if (2 * chunk * bps > 200 * 1024) continue;
        double t = Median([&] { kernel<<<sms * bps, 256, 2 * chunk, st>>>(dp, n); }, st, reps);
        std::printf("  bulk %s, %d blocks/SM: %.2f GB/s (%.3f)\n", name, bps, bytes / t / 1e9, (bytes / t) / (gib / base));
        check(name);
      }
    };
    // The DMA engines: the pieces dealt round-robin over k streams, one batch call per stream,
    // all started before any is waited for. Timed on the host (post to the last stream done).
    {
      std::vector<cudaStream_t> streams(8);
      for (auto& x : streams) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
      int engines = 0;
      CK(cudaDeviceGetAttribute(&engines, cudaDevAttrAsyncEngineCount, 0));
      std::printf("  (async engines: %d)\n", engines);
      for (int k : {1, 2, 4, 8}) {
        std::vector<std::vector<void*>> dsts(k);
        std::vector<std::vector<const void*>> srcs(k);
        std::vector<std::vector<size_t>> sizes(k);
        for (unsigned i = 0; i < n; ++i) {
          dsts[i % k].push_back(reinterpret_cast<void*>(ps[i].dst));
          srcs[i % k].push_back(reinterpret_cast<const void*>(ps[i].src));
          sizes[i % k].push_back(piece);
        }
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t attr_index = 0;
        std::vector<double> secs;
        for (int r = 0; r < 6; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          for (int j = 0; j < k; ++j)
            CK(cudaMemcpyBatchAsync(dsts[j].data(), srcs[j].data(), sizes[j].data(), dsts[j].size(), &attr, &attr_index, 1, streams[j]));
          for (int j = 0; j < k; ++j) CK(cudaStreamSynchronize(streams[j]));
          if (r > 0) secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(secs.begin(), secs.end());
        const double t = secs[secs.size() / 2];
        std::printf("  batch DMA over %d streams: %.2f GB/s (%.3f)\n", k, bytes / t / 1e9, (bytes / t) / (gib / base));
        check("dma");
      }
      for (auto& x : streams) CK(cudaStreamDestroy(x));
    }
    // The copy engines and the SMs together: the first share of the pieces goes to one batch
    // call per DMA stream, the rest to the warp kernel, all posted before any is waited for.
    {
      std::vector<cudaStream_t> streams(2);
      for (auto& x : streams) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attr_index = 0;
      for (int k : {1, 2}) {
        for (int pct : {0, 20, 30, 40, 50, 60, 70}) {
          const unsigned nd = static_cast<unsigned>(size_t(n) * pct / 100);
          std::vector<std::vector<void*>> dsts(k);
          std::vector<std::vector<const void*>> srcs(k);
          std::vector<std::vector<size_t>> sizes(k);
          for (unsigned i = 0; i < nd; ++i) {
            dsts[i % k].push_back(reinterpret_cast<void*>(ps[i].dst));
            srcs[i % k].push_back(reinterpret_cast<const void*>(ps[i].src));
            sizes[i % k].push_back(piece);
          }
          std::vector<double> secs;
          for (int r = 0; r < 8; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            if (nd < n) WarpCopy<<<sms * 2, 256, 0, st>>>(dp + nd, n - nd);
            for (int j = 0; j < k; ++j)
              if (!dsts[j].empty())
                CK(cudaMemcpyBatchAsync(dsts[j].data(), srcs[j].data(), sizes[j].data(), dsts[j].size(), &attr, &attr_index, 1, streams[j]));
            CK(cudaStreamSynchronize(st));
            for (int j = 0; j < k; ++j) CK(cudaStreamSynchronize(streams[j]));
            if (r > 1) secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          std::sort(secs.begin(), secs.end());
          const double t = secs[secs.size() / 2];
          std::printf("  split %d%% to DMA over %d streams: %.2f GB/s (%.3f)\n", pct, k, bytes / t / 1e9, (bytes / t) / (gib / base));
          check("split");
        }
      }
      for (auto& x : streams) CK(cudaStreamDestroy(x));
    }
    if (std::getenv("PROBE_SPLIT_ONLY")) { CK(cudaFree(dp)); CK(cudaFree(src)); CK(cudaFreeHost(host)); continue; }
    bulk(BulkCopy<4096>, 4096, "4K");
    bulk(BulkCopy<8192>, 8192, "8K");
    bulk(BulkCopy<16384>, 16384, "16K");
    CK(cudaFree(dp));
    CK(cudaFree(src));
    CK(cudaFreeHost(host));
  }
  return 0;
}
