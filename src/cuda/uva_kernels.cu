// The UVA-mode kernel (see uva_kernels.h). One warp per token in a grid-stride loop: lanes
// compute the ids of 32 heads at a time. Then, where rows, table and destination allow 16-byte
// words, the warp treats those heads' rows as one array of words and each lane loads up to
// kWordsInFlight of them before storing any: every row read over the link is in flight at once,
// instead of one round trip per row (a store may alias a later load, so the compiler cannot
// hoist the loads itself). Otherwise rows are copied one by one, bytewise.
#include <cuda_runtime.h>

#include "cuda/kernel_check.h"
#include "cuda/uva_device.h"
#include "cuda/uva_kernels.h"

namespace ferry::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
// 16-byte words each lane keeps in flight: 32 lanes x 10 words = 16 rows of 320 bytes, one
// token of the model's layout, in one round trip.
constexpr int kWordsInFlight = 10;

// Copies (or zeroes, for rows >= table_rows) the rows of heads [hb, hb + count) of one token,
// whose ids sit in lanes 0..count-1 of `id`. REQUIRES: 16-byte aligned rows, table and dst.
__device__ void CopyRowsWide(uint4* __restrict__ out, const uint4* __restrict__ table, uint64_t table_rows,
                             uint32_t words_per_row, uint64_t id, int count, int lane) {
  const uint32_t total = static_cast<uint32_t>(count) * words_per_row;
  for (uint32_t base = 0; base < total; base += kWarp * kWordsInFlight) {
    uint4 v[kWordsInFlight];
#pragma unroll
    for (int u = 0; u < kWordsInFlight; ++u) {
      const uint32_t k = base + u * kWarp + lane;
      const uint32_t h = k < total ? k / words_per_row : 0;
      const uint64_t row = __shfl_sync(0xffffffffu, id, static_cast<int>(h));
      if (k < total) {
        v[u] = row < table_rows ? table[row * words_per_row + (k - h * words_per_row)] : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kWordsInFlight; ++u) {
      const uint32_t k = base + u * kWarp + lane;
      if (k < total) out[k] = v[u];
    }
  }
}

__device__ __forceinline__ void Fail(int32_t* error, int32_t kind) { atomicCAS(error, 0, kind); }

__device__ void CopyRow(uint8_t* dst, const uint8_t* src, uint64_t bytes, bool wide, int lane) {
  if (wide) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t k = lane; k < bytes / 16; k += kWarp) d[k] = s[k];
  } else {
    for (uint64_t k = lane; k < bytes; k += kWarp) dst[k] = src[k];
  }
}

__device__ void ZeroRow(uint8_t* dst, uint64_t bytes, bool wide, int lane) {
  if (wide) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t k = lane; k < bytes / 16; k += kWarp) d[k] = make_uint4(0, 0, 0, 0);
  } else {
    for (uint64_t k = lane; k < bytes; k += kWarp) dst[k] = 0;
  }
}

__global__ void UvaGatherKernel(UvaStepArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const bool wide = a.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.table) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(a.dst) % 16 == 0;
  // The first warp checks the query starts (others read them assuming they are sound; every
  // index below is bounds-checked, so unsound ones only give wrong rows and this error).
  if (warp == 0) {
    if (lane == 0 && a.query_start[0] != 0) Fail(a.error, kUvaBadQueryStart);
    if (lane == 0 && a.query_start[a.num_reqs] > a.num_tokens) Fail(a.error, kUvaQueryStartPastEnd);
    for (int64_t r = lane; r < a.num_reqs; r += kWarp)
      if (a.query_start[r + 1] < a.query_start[r]) Fail(a.error, kUvaBadQueryStart);
  }
  const uint64_t token_bytes = static_cast<uint64_t>(a.num_heads) * a.row_bytes;
  for (int64_t t = warp; t < a.num_tokens; t += warps) {
    int64_t r = 0, i = 0;
    bool real = uva::FindToken(a, t, &r, &i);
    if (real && !uva::IdsInVocabulary(a, t, r, i)) {
      if (lane == 0) Fail(a.error, kUvaIdOutOfRange);
      real = false;
    }
    uint8_t* out = a.dst + t * token_bytes;
    for (int hb = 0; hb < a.num_heads; hb += kWarp) {  // ids of 32 heads, one per lane
      const int h = hb + lane;
      const uint64_t id = real && h < a.num_heads ? uva::RowId(a, t, r, i, h) : uva::kNoRow;
      const int count = a.num_heads - hb < kWarp ? a.num_heads - hb : kWarp;
      if (wide) {
        CopyRowsWide(reinterpret_cast<uint4*>(out + static_cast<uint64_t>(hb) * a.row_bytes),
                     reinterpret_cast<const uint4*>(a.table), a.table_rows,
                     static_cast<uint32_t>(a.row_bytes / 16), id, count, lane);
        continue;
      }
      for (int j = 0; j < count; ++j) {  // then the warp copies those rows one by one
        const uint64_t row = __shfl_sync(0xffffffffu, id, j);
        uint8_t* d = out + static_cast<uint64_t>(hb + j) * a.row_bytes;
        if (row >= a.table_rows)
          ZeroRow(d, a.row_bytes, wide, lane);
        else
          CopyRow(d, a.table + row * a.row_bytes, a.row_bytes, wide, lane);
      }
    }
  }
}

}  // namespace

int LaunchUvaGather(const UvaStepArgs& args, CUstream_st* stream) {
  if (args.num_tokens == 0) return 0;
  const int64_t threads = kWarpsPerBlock * kWarp;
  int64_t blocks = (args.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 65535) blocks = 65535;
  UvaGatherKernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0, stream>>>(
      args);
  return static_cast<int>(cudaGetLastError());
}

// The spin kernel (LaunchSpin): %globaltimer counts nanoseconds (updated every microsecond or
// so), the same on every SM, unlike clock64 whose rate follows the SM clock.
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimer();
  while (GlobalTimer() - start < nanoseconds) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(256);  // leaves the SM's issue slots to other work while it waits
#endif
  }
}

}  // namespace

int LaunchSpin(uint64_t nanoseconds, CUstream_st* stream) {
  SpinKernel<<<1, 1, 0, stream>>>(nanoseconds);
  return static_cast<int>(cudaGetLastError());
}

int ProbeUvaKernels() {
  cudaFuncAttributes attributes{};
  return static_cast<int>(cudaFuncGetAttributes(&attributes, UvaGatherKernel));
}

}  // namespace ferry::cuda
