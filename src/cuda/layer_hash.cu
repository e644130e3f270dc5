// The layer checksum's kernel (see layer_hash.h). One warp per (token, head, K/V) slice in a
// grid-stride loop, its lanes over the slice's 8-byte words (a head of 128 fp16 elements is
// one word a lane); each thread keeps a running sum, the warp adds its lanes' with shuffles,
// the block its warps' in shared memory, and one atomicAdd a block lands it in *out. Addition
// mod 2^64 commutes, so the result is the host's whatever the order.
#include <cuda_runtime.h>

#include "cuda/kernel_check.h"
#include "cuda/layer_hash.h"

namespace ferry::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int64_t kMaxBlocks = 1024;

// Word `j` of a slice at `p` of `bytes` bytes, little-endian, zero-padded past the end.
__device__ __forceinline__ uint64_t LoadWord(const uint8_t* p, uint64_t bytes, uint64_t j, bool aligned) {
  const uint64_t at = j * 8;
  if (aligned && at + 8 <= bytes) return *reinterpret_cast<const uint64_t*>(p + at);
  const uint64_t n = bytes - at < 8 ? bytes - at : 8;
  uint64_t v = 0;
  for (uint64_t b = 0; b < n; ++b) v |= static_cast<uint64_t>(p[at + b]) << (8 * b);
  return v;
}

__global__ void LayerHashKernel(LayerHashArgs a) {
  __shared__ unsigned long long partial[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp;
  const uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * blockDim.x / kWarp;
  const uint64_t words = (a.head_bytes + 7) / 8;
  const uint64_t slices = a.tokens * a.head_count * a.num_tensors;
  uint64_t sum = 0;
  for (uint64_t s = warp; s < slices; s += warps) {
    const uint32_t kv = static_cast<uint32_t>(s % a.num_tensors);
    const uint64_t th = s / a.num_tensors;
    const uint32_t h = static_cast<uint32_t>(th % a.head_count);
    const uint64_t t = th / a.head_count;
    const uint64_t in = t % a.block_tokens;
    const uint64_t kblock = a.blocks[t / a.block_tokens] * (a.block_tokens / a.kernel_block) + in / a.kernel_block;
    const LayerHashTensor& tl = a.tensors[kv];
    const uint8_t* p = tl.base + kblock * tl.block_stride + (in % a.kernel_block) * tl.token_stride +
                       static_cast<uint64_t>(a.local_first + h) * tl.head_stride;
    const bool aligned = reinterpret_cast<uintptr_t>(p) % 8 == 0;
    const uint64_t first = ((t * a.total_heads + a.head_begin + h) * 2 + kv) * words;
    for (uint64_t j = lane; j < words; j += kWarp) {
      sum += LayerHashTerm(a.seed + (first + j) * kLayerHashStep, LoadWord(p, a.head_bytes, j, aligned));
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if (lane == 0) partial[threadIdx.x / kWarp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += partial[w];
    atomicAdd(a.out, total);
  }
}

}  // namespace

int LaunchLayerHash(const LayerHashArgs& args, CUstream_st* stream) {
  const uint64_t slices = args.tokens * args.head_count * args.num_tensors;
  if (slices == 0) return 0;
  int64_t blocks = static_cast<int64_t>((slices + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  LayerHashKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int ProbeLayerHashKernels() {
  cudaFuncAttributes attributes{};
  return static_cast<int>(cudaFuncGetAttributes(&attributes, LayerHashKernel));
}

}  // namespace ferry::cuda
