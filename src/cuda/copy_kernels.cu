// The batched gather/scatter copy kernel. Kept free of logging and formatting headers (nvcc
// with g++ 13 rejects fmt's compile-time format strings).
#include <cuda_runtime.h>

#include "cuda/copy_kernels.h"
#include "cuda/kernel_check.h"

namespace ferry::cuda {
namespace {

constexpr int kWarp = 32;
// Words in flight per lane, and resident blocks per SM the kernel is compiled for. Measured on
// an H200 (bench/results/cuda_local.md): unroll 8 at 4 blocks/SM (56 registers, no spills)
// was the fastest of {4 at 8 (spills), 4 at any, 2 at 8, 8 at 4} on every path.
constexpr int kUnroll = 8;
constexpr int kMinBlocksPerSm = 4;

// Sizes inside the kernel are 32-bit: the caller cuts pieces to kMaxPieceBytes, and 32-bit
// indices save registers.

// Copies `n` bytes one byte per lane.
__device__ __forceinline__ void CopyBytes(char* __restrict__ dst, const char* __restrict__ src,
                                          uint32_t n, int lane) {
  for (uint32_t i = lane; i < n; i += kWarp) dst[i] = src[i];
}

// Copies `n` bytes whose dst and src are both aligned to sizeof(W); the tail that does not
// fill a whole word is copied bytewise.
template <typename W>
__device__ __forceinline__ void CopyWords(char* __restrict__ dst, const char* __restrict__ src,
                                          uint32_t n, int lane) {
  const uint32_t words = n / sizeof(W);
  W* d = reinterpret_cast<W*>(dst);
  const W* s = reinterpret_cast<const W*>(src);
  uint32_t i = lane;
  for (; i + (kUnroll - 1) * kWarp < words; i += kUnroll * kWarp) {
    W v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * kWarp] = v[u];
  }
  for (; i < words; i += kWarp) d[i] = s[i];
  const uint32_t done = words * sizeof(W);
  CopyBytes(dst + done, src + done, n - done, lane);
}

// Aligns dst to W bytes with a bytewise head (src follows, as both share their alignment
// mod W), then copies whole words.
template <typename W>
__device__ __forceinline__ void CopyAligned(char* dst, const char* src, uint32_t n, int lane) {
  uint32_t head = (sizeof(W) - (reinterpret_cast<uintptr_t>(dst) & (sizeof(W) - 1))) & (sizeof(W) - 1);
  if (head > n) head = n;
  CopyBytes(dst, src, head, lane);
  CopyWords<W>(dst + head, src + head, n - head, lane);
}

__device__ __forceinline__ void CopyPiece(char* dst, const char* src, uint32_t n, int lane) {
  const uintptr_t skew = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if (n < 64) {
    CopyBytes(dst, src, n, lane);
  } else if ((skew & 15) == 0) {
    CopyAligned<uint4>(dst, src, n, lane);
  } else if ((skew & 7) == 0) {
    CopyAligned<uint2>(dst, src, n, lane);
  } else if ((skew & 3) == 0) {
    CopyAligned<uint32_t>(dst, src, n, lane);
  } else if ((skew & 1) == 0) {
    CopyAligned<uint16_t>(dst, src, n, lane);
  } else {
    CopyWords<unsigned char>(dst, src, n, lane);
  }
}

__global__ void __launch_bounds__(kCopyThreadsPerBlock, kMinBlocksPerSm)
    BatchCopyKernel(const Piece* __restrict__ pieces, uint32_t count) {
  const int lane = threadIdx.x % kWarp;
  const uint32_t warps_per_block = blockDim.x / kWarp;
  const uint32_t total_warps = gridDim.x * warps_per_block;
  for (uint32_t p = blockIdx.x * warps_per_block + threadIdx.x / kWarp; p < count; p += total_warps) {
    const Piece piece = pieces[p];
    CopyPiece(reinterpret_cast<char*>(piece.dst), reinterpret_cast<const char*>(piece.src),
              static_cast<uint32_t>(piece.size), lane);
  }
}

__device__ __forceinline__ void CopyOp(const OffsetPiece& op, char* dst, const char* src, bool write, int lane) {
  const uint64_t to = write ? op.remote_offset : op.local_offset;
  const uint64_t from = write ? op.local_offset : op.remote_offset;
  CopyPiece(dst + to, src + from, static_cast<uint32_t>(op.size), lane);
}

// kAhead: each warp loads its next op before it copies the current one, so that ops read from
// mapped host memory (over PCIe, about a microsecond away) arrive while the warp copies.
template <bool kAhead>
__global__ void __launch_bounds__(kCopyThreadsPerBlock, kMinBlocksPerSm)
    OffsetCopyKernel(const OffsetPiece* __restrict__ ops, uint32_t count, char* dst, const char* src, bool write) {
  const int lane = threadIdx.x % kWarp;
  const uint32_t warps_per_block = blockDim.x / kWarp;
  const uint32_t total_warps = gridDim.x * warps_per_block;
  uint32_t p = blockIdx.x * warps_per_block + threadIdx.x / kWarp;
  if constexpr (kAhead) {
    if (p >= count) return;
    OffsetPiece next = ops[p];
    for (; p < count; p += total_warps) {
      const OffsetPiece op = next;
      if (p + total_warps < count) next = ops[p + total_warps];
      CopyOp(op, dst, src, write, lane);
    }
  } else {
    for (; p < count; p += total_warps) CopyOp(ops[p], dst, src, write, lane);
  }
}

}  // namespace

int LaunchOffsetCopy(const OffsetPiece* ops, uint32_t count, char* dst, const char* src, bool write,
                     uint32_t max_blocks, CUstream_st* stream, bool ops_ahead) {
  if (count == 0) return cudaSuccess;
  constexpr uint32_t kWarpsPerBlock = kCopyThreadsPerBlock / kWarp;
  uint32_t blocks = (count + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
  if (ops_ahead) {
    OffsetCopyKernel<true><<<blocks, kCopyThreadsPerBlock, 0, stream>>>(ops, count, dst, src, write);
  } else {
    OffsetCopyKernel<false><<<blocks, kCopyThreadsPerBlock, 0, stream>>>(ops, count, dst, src, write);
  }
  return cudaGetLastError();
}

int LaunchBatchCopy(const Piece* pieces, uint32_t count, uint32_t max_blocks, CUstream_st* stream) {
  if (count == 0) return cudaSuccess;
  constexpr uint32_t kWarpsPerBlock = kCopyThreadsPerBlock / kWarp;
  uint32_t blocks = (count + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
  BatchCopyKernel<<<blocks, kCopyThreadsPerBlock, 0, stream>>>(pieces, count);
  return cudaGetLastError();
}

int ProbeCopyKernels() {
  cudaFuncAttributes attributes{};
  if (cudaError_t e = cudaFuncGetAttributes(&attributes, OffsetCopyKernel<false>); e != cudaSuccess)
    return static_cast<int>(e);
  if (cudaError_t e = cudaFuncGetAttributes(&attributes, OffsetCopyKernel<true>); e != cudaSuccess)
    return static_cast<int>(e);
  return static_cast<int>(cudaFuncGetAttributes(&attributes, BatchCopyKernel));
}

}  // namespace ferry::cuda
