// copy_kernel_probe: what a scattered copy kernel within one GPU loses to a bulk device copy,
// and what a warp's way of taking its pieces changes. 80,000 pieces scattered on both sides of
// one GPU (each piece a random slot of the source and of the destination), copied by:
//   - ferry's kernel as it is (src/cuda/copy_kernels.cu: one warp per piece, 16-byte words,
//     8 in flight per lane, the piece's descriptor loaded when the warp takes it);
//   - the same, each warp loading its next piece's descriptor before copying this one, so the
//     descriptor's load does not stand between two pieces;
//   - the same with 16 words in flight per lane;
// each at 1, 2 and 4 blocks of 256 threads per SM, beside one cudaMemcpyAsync of the batch's
// bytes (contiguous) and of 1 GiB. Times are CUDA events, medians of 7; the bytes are checked.
//
// A probe, not part of the build (results in bench/results/cuda_ipc.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/copy_kernel_probe bench/copy_kernel_probe.cu && /tmp/copy_kernel_probe [pieces=80000]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "probe_util.cuh"


struct Op {
  uint64_t src;
  uint64_t dst;
  uint64_t size;
};

template <int kUnroll>
__device__ __forceinline__ void CopyWords(uint4* __restrict__ d, const uint4* __restrict__ s, uint32_t words,
                                          int lane) {
  uint32_t i = lane;
  for (; i + (kUnroll - 1) * 32 < words; i += kUnroll * 32) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * 32];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * 32] = v[u];
  }
  for (; i < words; i += 32) d[i] = s[i];
}

// kPrefetch: the warp loads its next op before copying this one.
template <int kUnroll, bool kPrefetch>
__global__ void __launch_bounds__(256) Copy(const Op* __restrict__ ops, uint32_t count, char* dst, const char* src) {
  const int lane = threadIdx.x % 32;
  const uint32_t wpb = blockDim.x / 32, total = gridDim.x * wpb;
  uint32_t p = blockIdx.x * wpb + threadIdx.x / 32;
  if (p >= count) return;
  Op op = ops[p];
  for (; p < count; p += total) {
    Op next{};
    if (kPrefetch) {
      if (p + total < count) next = ops[p + total];
    } else {
      op = ops[p];
    }
    CopyWords<kUnroll>(reinterpret_cast<uint4*>(dst + op.dst), reinterpret_cast<const uint4*>(src + op.src),
                       static_cast<uint32_t>(op.size / 16), lane);
    if (kPrefetch) op = next;
  }
}

__global__ void Fill(uint32_t* w, size_t words, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words; i += size_t{gridDim.x} * blockDim.x)
    w[i] = static_cast<uint32_t>(i * 4) + salt;
}

template <typename F>
float Median(F&& run, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  run();  // warm
  CK(cudaStreamSynchronize(s));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a, s));
    run();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const uint32_t n = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 80000;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t gib = size_t{1} << 30;
  char *big_a, *big_b;
  CK(cudaMalloc(&big_a, gib));
  CK(cudaMalloc(&big_b, gib));
  const float gib_ms = Median([&] { CK(cudaMemcpyAsync(big_b, big_a, gib, cudaMemcpyDeviceToDevice, s)); }, s);
  CK(cudaFree(big_a));
  CK(cudaFree(big_b));
  const double gib_rate = gib / (gib_ms * 1e-3);
  std::printf("1 GiB device copy: %.3f ms, %.1f GB/s; pieces %u, %d SMs\n", gib_ms, gib_rate / 1e9, n, sms);
  std::printf("%-8s %-26s %8s %10s %8s\n", "piece", "variant", "ms", "GB/s", "of 1GiB");

  std::mt19937_64 rng(7);
  for (uint32_t kib : {16u, 32u, 128u}) {
    const uint64_t piece = uint64_t{kib} << 10, bytes = piece * n;
    char *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    std::vector<uint32_t> from(n), to(n);
    std::iota(from.begin(), from.end(), 0u);
    std::iota(to.begin(), to.end(), 0u);
    std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<Op> ops(n);
    for (uint32_t i = 0; i < n; ++i) ops[i] = {from[i] * piece, to[i] * piece, piece};
    Op* d_ops;
    CK(cudaMalloc(&d_ops, n * sizeof(Op)));
    CK(cudaMemcpy(d_ops, ops.data(), n * sizeof(Op), cudaMemcpyHostToDevice));
    // Source words are their own byte offsets (low 32 bits), so the check can name a misplaced word.
    Fill<<<sms * 8, 256, 0, s>>>(reinterpret_cast<uint32_t*>(src), bytes / 4, kib);
    CK(cudaStreamSynchronize(s));

    auto report = [&](const char* name, float ms) {
      const double rate = bytes / (ms * 1e-3);
      std::printf("%-8u %-26s %8.3f %10.1f %8.3f\n", kib, name, ms, rate / 1e9, rate / gib_rate);
    };
    auto check = [&](const char* name) {
      std::vector<uint32_t> got(bytes / 4);
      CK(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDeviceToHost));
      for (uint32_t i = 0; i < n; i += 97) {
        const size_t d = ops[i].dst / 4, sw = ops[i].src / 4;
        for (size_t w = 0; w < piece / 4; w += 61)
          if (got[d + w] != static_cast<uint32_t>((sw + w) * 4) + kib) {
            std::printf("%s: wrong bytes in piece %u\n", name, i);
            std::exit(1);
          }
      }
      CK(cudaMemset(dst, 0, bytes));
    };
    report("cudaMemcpy, same bytes", Median([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); }, s));
    CK(cudaMemset(dst, 0, bytes));
    auto variant = [&](const char* name, auto kernel, int per_sm) {
      const uint32_t blocks = std::min<uint32_t>(sms * per_sm, (n + 7) / 8);
      const float ms = Median([&] { kernel<<<blocks, 256, 0, s>>>(d_ops, n, dst, src); CK(cudaGetLastError()); }, s);
      char label[64];
      std::snprintf(label, sizeof label, "%s, %d/SM", name, per_sm);
      report(label, ms);
      check(label);
    };
    for (int per_sm : {1, 2, 4}) {
      variant("ferry (u8)", Copy<8, false>, per_sm);
      variant("prefetch next (u8)", Copy<8, true>, per_sm);
      variant("prefetch next (u16)", Copy<16, true>, per_sm);
    }
    CK(cudaFree(d_ops));
    CK(cudaFree(src));
    CK(cudaFree(dst));
  }
  return 0;
}
