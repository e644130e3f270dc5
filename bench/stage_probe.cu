// stage_probe: can scattered GPU pieces reach the copy engines' bulk rate to and from pinned
// host memory when the host side is contiguous (a request's blocks offloaded into one host
// slab, or loaded back from it)? The SMs gather the pieces into a device staging buffer and a
// copy engine moves each chunk of it in one cudaMemcpyAsync, the two pipelined over a few
// staging slots (GPU -> host); the reverse for host -> GPU. Beside them in the same run: one
// 1 GiB pinned copy each way (the baseline), the SMs storing the same pieces into host memory
// directly (ferry's copy kernel's way), and cudaMemcpy2DAsync for a regular layout (pieces at
// a fixed stride). Times are CUDA events, medians of 5; the bytes are checked.
//
// A probe, not part of the build (results in bench/results/cuda_ipc.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/stage_probe bench/stage_probe.cu && /tmp/stage_probe [pieces=80000]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "probe_util.cuh"


// One warp per piece, 16-byte words, 8 in flight per lane. Piece p of [first, first + n) moves
// between scattered slot slots[p] of `dev` and position (p - first) of `flat`.
template <bool kToFlat>
__global__ void __launch_bounds__(256, 4)
    Move(char* dev, const unsigned* slots, unsigned first, unsigned n, char* flat, unsigned piece) {
  const int lane = threadIdx.x % 32;
  const unsigned wpb = blockDim.x / 32, total = gridDim.x * wpb;
  const unsigned words = piece / 16;
  for (unsigned p = blockIdx.x * wpb + threadIdx.x / 32; p < n; p += total) {
    uint4* a = reinterpret_cast<uint4*>(dev + static_cast<size_t>(slots[first + p]) * piece);
    uint4* b = reinterpret_cast<uint4*>(flat + static_cast<size_t>(p) * piece);
    const uint4* s = kToFlat ? a : b;
    uint4* d = kToFlat ? b : a;
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

int g_blocks = 0;

template <bool kToFlat>
void LaunchMove(char* dev, const unsigned* slots, unsigned first, unsigned n, char* flat, unsigned piece,
                cudaStream_t s) {
  unsigned blocks = std::min<unsigned>((n + 7) / 8, g_blocks);
  Move<kToFlat><<<blocks, 256, 0, s>>>(dev, slots, first, n, flat, piece);
  CK(cudaGetLastError());
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Fills slot i of the device buffer with words that name (i, word).
__global__ void Pattern(uint32_t* dev, size_t words_per_slot, size_t slots) {
  size_t n = words_per_slot * slots;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < n; w += size_t(gridDim.x) * blockDim.x)
    dev[w] = static_cast<uint32_t>((w / words_per_slot) * 2654435761u + (w % words_per_slot));
}

// The host slab holds piece p (slot slots[p]) at position p: checks the first and last word of each.
bool CheckFlat(const char* flat, const std::vector<unsigned>& slots, unsigned pieces, unsigned piece) {
  const size_t wps = piece / 4;
  for (unsigned p = 0; p < pieces; ++p) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(flat + size_t(p) * piece);
    uint32_t first = static_cast<uint32_t>(slots[p] * 2654435761u), last = first + uint32_t(wps - 1);
    if (w[0] != first || w[wps - 1] != last) {
      std::printf("  MISMATCH at piece %u\n", p);
      return false;
    }
  }
  return true;
}

int main(int argc, char** argv) {
  const unsigned pieces = argc > 1 ? std::atoi(argv[1]) : 80000;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  g_blocks = sms * 4;
  cudaStream_t ks, ds;
  CK(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking));
  Timer t;
  const int kReps = 5;

  // Baseline: 1 GiB pinned copies each way.
  const size_t gib = size_t{1} << 30;
  char *hb, *db;
  CK(cudaHostAlloc(&hb, gib, cudaHostAllocDefault));
  CK(cudaMalloc(&db, gib));
  std::memset(hb, 1, gib);
  double d2h_gbs = 0, h2d_gbs = 0;
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<double> ms;
    for (int r = 0; r < kReps + 1; ++r) {
      CK(cudaEventRecord(t.a, ds));
      if (dir == 0) CK(cudaMemcpyAsync(hb, db, gib, cudaMemcpyDeviceToHost, ds));
      else CK(cudaMemcpyAsync(db, hb, gib, cudaMemcpyHostToDevice, ds));
      CK(cudaEventRecord(t.b, ds));
      CK(cudaEventSynchronize(t.b));
      float m = 0;
      CK(cudaEventElapsedTime(&m, t.a, t.b));
      if (r > 0) ms.push_back(m);
    }
    (dir == 0 ? d2h_gbs : h2d_gbs) = gib / Median(ms) / 1e6;
  }
  CK(cudaFreeHost(hb));
  CK(cudaFree(db));
  std::printf("pinned 1 GiB copy: GPU->host %.2f GB/s, host->GPU %.2f GB/s (pieces per batch %u, %d SMs)\n",
              d2h_gbs, h2d_gbs, pieces, sms);

  for (unsigned piece : {16u << 10, 32u << 10, 128u << 10}) {
    const size_t bytes = size_t(pieces) * piece;
    char *dev, *host;
    unsigned* dslots;
    CK(cudaMalloc(&dev, bytes));
    CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    std::vector<unsigned> slots(pieces);
    std::iota(slots.begin(), slots.end(), 0u);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(7));
    CK(cudaMalloc(&dslots, pieces * sizeof(unsigned)));
    CK(cudaMemcpy(dslots, slots.data(), pieces * sizeof(unsigned), cudaMemcpyHostToDevice));
    auto pattern = [&] {
      Pattern<<<sms * 8, 256>>>(reinterpret_cast<uint32_t*>(dev), piece / 4, pieces);
      CK(cudaDeviceSynchronize());
    };
    auto timed = [&](auto&& body, double base_gbs) {
      std::vector<double> ms;
      for (int r = 0; r < kReps + 1; ++r) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(t.a, ks));
        CK(cudaStreamWaitEvent(ds, t.a, 0));
        body();
        CK(cudaEventRecord(t.b, ds));
        CK(cudaStreamWaitEvent(ks, t.b, 0));
        CK(cudaEventRecord(t.b, ks));
        CK(cudaEventSynchronize(t.b));
        float m = 0;
        CK(cudaEventElapsedTime(&m, t.a, t.b));
        if (r > 0) ms.push_back(m);
      }
      const double gbs = bytes / Median(ms) / 1e6;
      std::printf(" %7.2f GB/s (%.3f)", gbs, gbs / base_gbs);
    };

    // GPU -> host slab.
    std::printf("%3u KiB GPU->host  SM stores into host:", piece >> 10);
    pattern();
    std::memset(host, 0, bytes);
    timed([&] { LaunchMove<true>(dev, dslots, 0, pieces, host, piece, ks); }, d2h_gbs);
    std::printf(" %s\n", CheckFlat(host, slots, pieces, piece) ? "ok" : "BAD");
    for (size_t chunk_mib : {2, 4, 8, 16, 32}) {
      for (int nslots : {2, 3}) {
        const size_t chunk = chunk_mib << 20;
        const unsigned per = static_cast<unsigned>(chunk / piece);
        char* staging;
        CK(cudaMalloc(&staging, chunk * nslots));
        std::vector<cudaEvent_t> gathered(nslots), copied(nslots);
        for (int i = 0; i < nslots; ++i) {
          CK(cudaEventCreateWithFlags(&gathered[i], cudaEventDisableTiming));
          CK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
        }
        std::memset(host, 0, bytes);
        std::printf("%3u KiB GPU->host  gather + DMA, %2zu MiB x %d:", piece >> 10, chunk_mib, nslots);
        timed(
            [&] {
              unsigned c = 0;
              for (unsigned first = 0; first < pieces; first += per, ++c) {
                const unsigned n = std::min(per, pieces - first);
                const int s = c % nslots;
                char* stage = staging + size_t(s) * chunk;
                if (c >= unsigned(nslots)) CK(cudaStreamWaitEvent(ks, copied[s], 0));
                LaunchMove<true>(dev, dslots, first, n, stage, piece, ks);
                CK(cudaEventRecord(gathered[s], ks));
                CK(cudaStreamWaitEvent(ds, gathered[s], 0));
                CK(cudaMemcpyAsync(host + size_t(first) * piece, stage, size_t(n) * piece, cudaMemcpyDeviceToHost, ds));
                CK(cudaEventRecord(copied[s], ds));
              }
            },
            d2h_gbs);
        std::printf(" %s\n", CheckFlat(host, slots, pieces, piece) ? "ok" : "BAD");

        // host slab -> GPU: DMA a chunk into staging, the SMs scatter it.
        CK(cudaMemset(dev, 0, bytes));
        std::printf("%3u KiB host->GPU  DMA + scatter, %2zu MiB x %d:", piece >> 10, chunk_mib, nslots);
        timed(
            [&] {
              unsigned c = 0;
              for (unsigned first = 0; first < pieces; first += per, ++c) {
                const unsigned n = std::min(per, pieces - first);
                const int s = c % nslots;
                char* stage = staging + size_t(s) * chunk;
                if (c >= unsigned(nslots)) CK(cudaStreamWaitEvent(ds, gathered[s], 0));  // scattered already
                CK(cudaMemcpyAsync(stage, host + size_t(first) * piece, size_t(n) * piece, cudaMemcpyHostToDevice, ds));
                CK(cudaEventRecord(copied[s], ds));
                CK(cudaStreamWaitEvent(ks, copied[s], 0));
                LaunchMove<false>(dev, dslots, first, n, stage, piece, ks);
                CK(cudaEventRecord(gathered[s], ks));
              }
            },
            h2d_gbs);
        // Check: back to the host through the SMs, then compare.
        std::memset(host, 0, bytes);
        LaunchMove<true>(dev, dslots, 0, pieces, host, piece, ks);
        CK(cudaStreamSynchronize(ks));
        std::printf(" %s\n", CheckFlat(host, slots, pieces, piece) ? "ok" : "BAD");
        for (int i = 0; i < nslots; ++i) {
          CK(cudaEventDestroy(gathered[i]));
          CK(cudaEventDestroy(copied[i]));
        }
        CK(cudaFree(staging));
      }
    }
    // host slab -> GPU through the SMs' loads from host memory (ferry's kernel's way).
    pattern();
    LaunchMove<true>(dev, dslots, 0, pieces, host, piece, ks);
    CK(cudaStreamSynchronize(ks));
    CK(cudaMemset(dev, 0, bytes));
    std::printf("%3u KiB host->GPU  SM loads from host:", piece >> 10);
    timed([&] { LaunchMove<false>(dev, dslots, 0, pieces, host, piece, ks); }, h2d_gbs);
    std::printf("\n");

    // A regular layout: every other slot of the device buffer into the host slab, one 2D copy.
    const unsigned half = pieces / 2;
    std::printf("%3u KiB GPU->host  cudaMemcpy2DAsync, %u pieces at stride 2:", piece >> 10, half);
    {
      std::vector<double> ms;
      for (int r = 0; r < kReps + 1; ++r) {
        CK(cudaEventRecord(t.a, ds));
        CK(cudaMemcpy2DAsync(host, piece, dev, 2 * size_t(piece), piece, half, cudaMemcpyDeviceToHost, ds));
        CK(cudaEventRecord(t.b, ds));
        CK(cudaEventSynchronize(t.b));
        float m = 0;
        CK(cudaEventElapsedTime(&m, t.a, t.b));
        if (r > 0) ms.push_back(m);
      }
      const double gbs = size_t(half) * piece / Median(ms) / 1e6;
      std::printf(" %7.2f GB/s (%.3f)\n", gbs, gbs / d2h_gbs);
    }
    CK(cudaFree(dev));
    CK(cudaFree(dslots));
    CK(cudaFreeHost(host));
  }
  return 0;
}
