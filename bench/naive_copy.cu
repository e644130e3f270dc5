// The naive baseline of bench/cuda_bench.cc's kv_d2d cases: one launch, one thread per 16-byte
// word of the whole batch, every piece the same size (what a user writes first). Not part of
// ferry.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/copy_kernels.h"

namespace ferry::cuda {
namespace {

__global__ void NaiveCopyKernel(const Piece* __restrict__ pieces, uint64_t words_per_piece, uint64_t words) {
  for (uint64_t w = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; w < words; w += uint64_t{gridDim.x} * blockDim.x) {
    const Piece p = pieces[w / words_per_piece];
    const uint64_t at = (w % words_per_piece) * 16;
    *reinterpret_cast<uint4*>(p.dst + at) = *reinterpret_cast<const uint4*>(p.src + at);
  }
}

}  // namespace

// REQUIRES: every piece is piece_bytes long, a multiple of 16, 16-byte aligned on both sides.
int LaunchNaiveCopy(const Piece* pieces, uint32_t count, uint64_t piece_bytes, CUstream_st* stream) {
  const uint64_t per = piece_bytes / 16, words = per * count;
  if (words == 0) return cudaSuccess;
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0); e != cudaSuccess) return e;
  NaiveCopyKernel<<<sms * 8, 256, 0, stream>>>(pieces, per, words);
  return cudaGetLastError();
}

}  // namespace ferry::cuda
