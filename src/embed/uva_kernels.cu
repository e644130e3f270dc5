// The UVA-mode kernel (see uva_kernels.h). One warp per token in a grid-stride loop: lanes
// compute the ids of 32 heads at a time, then the warp copies those rows one after the other,
// 16 bytes per lane where rows, table and destination allow, bytewise otherwise.
#include <cuda_runtime.h>

#include "embed/uva_device.h"
#include "embed/uva_kernels.h"

namespace ferry::embed {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;

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

int SynchronizeUvaStream(CUstream_st* stream) {
  return static_cast<int>(cudaStreamSynchronize(stream));
}

}  // namespace ferry::embed
