// The UVA-mode kernel (see uva_kernels.h). One warp per token in a grid-stride loop: lanes
// compute the ids of 32 heads at a time, then the warp copies those rows one after the other,
// 16 bytes per lane where rows, table and destination allow, bytewise otherwise.
#include <cuda_runtime.h>

#include "embed/uva_kernels.h"

namespace ferry::embed {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr uint64_t kNoRow = ~0ull;

__device__ __forceinline__ uint64_t Id(int32_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

__device__ __forceinline__ uint64_t FastModDevice(uint64_t x, uint64_t d, uint64_t magic) {
  uint64_t q = __umul64hi(x, magic);
  uint64_t r = x - q * d;
  return r >= d ? r - d : r;
}

__device__ __forceinline__ void Fail(int32_t* error, int32_t kind) { atomicCAS(error, 0, kind); }

// The row id of head h of token t in request r (index i in its request), as RowIdsOfRange.
__device__ uint64_t RowId(const UvaStepArgs& a, int64_t t, int64_t r, int64_t i, int h) {
  const int n = a.ngram;
  const int32_t* ctx = a.context + r * (n - 1);
  const int group = h / a.heads_per_ngram + 2;  // n-gram order of this head
  uint64_t mix = 0;
  bool blocked = false;
  for (int s = 0; s < group; ++s) {
    int32_t raw = i >= s ? a.tokens[t - s] : ctx[n - 1 + i - s];
    uint64_t v = Id(raw);
    uint64_t y = (s > 0 && blocked) ? a.eos : v;
    if (s > 0) blocked = blocked || v == a.eos;
    mix ^= y * a.multipliers[s];
  }
  const UvaHead head = a.heads[h];
  return FastModDevice(mix, head.size, head.magic) + head.offset;
}

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
    if (lane == 0 && (a.query_start[0] != 0 || a.query_start[a.num_reqs] > a.num_tokens))
      Fail(a.error, kUvaBadQueryStart);
    for (int64_t r = lane; r < a.num_reqs; r += kWarp)
      if (a.query_start[r + 1] < a.query_start[r]) Fail(a.error, kUvaBadQueryStart);
  }
  const uint64_t token_bytes = static_cast<uint64_t>(a.num_heads) * a.row_bytes;
  for (int64_t t = warp; t < a.num_tokens; t += warps) {
    // The request of token t: the last r with query_start[r] <= t (binary search for the first
    // index in [0, num_reqs] whose start is past t).
    int64_t l = 0, u = a.num_reqs + 1;
    while (l < u) {
      const int64_t mid = (l + u) / 2;
      if (a.query_start[mid] <= t) l = mid + 1;
      else u = mid;
    }
    const int64_t r = l - 1;
    // Padding past the last request; with unsound query starts also anything whose reads
    // could leave the inputs (a negative start).
    const bool padding =
        r < 0 || r >= a.num_reqs || t >= a.query_start[r + 1] || a.query_start[r] < 0;
    const int64_t i = padding ? 0 : t - a.query_start[r];
    uint8_t* out = a.dst + t * token_bytes;
    for (int hb = 0; hb < a.num_heads; hb += kWarp) {
      const int h = hb + lane;
      uint64_t id = kNoRow;
      if (!padding && h < a.num_heads) {
        // Ids of the token and its earlier tokens in the request must be in the vocabulary.
        bool bad = false;
        for (int s = 0; s < a.ngram; ++s) {
          int32_t raw = i >= s ? a.tokens[t - s] : a.context[r * (a.ngram - 1) + a.ngram - 1 + i - s];
          bad = bad || raw >= a.vocab_size;
        }
        if (bad) Fail(a.error, kUvaIdOutOfRange);
        else id = RowId(a, t, r, i, h);
        if (id != kNoRow && id >= a.table_rows) {
          Fail(a.error, kUvaIdOutOfRange);
          id = kNoRow;
        }
      }
      const int count = a.num_heads - hb < kWarp ? a.num_heads - hb : kWarp;
      for (int j = 0; j < count; ++j) {
        const uint64_t row = __shfl_sync(0xffffffffu, id, j);
        uint8_t* d = out + static_cast<uint64_t>(hb + j) * a.row_bytes;
        if (row == kNoRow) ZeroRow(d, a.row_bytes, wide, lane);
        else CopyRow(d, a.table + row * a.row_bytes, a.row_bytes, wide, lane);
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
  UvaGatherKernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0, stream>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int SynchronizeUvaStream(CUstream_st* stream) { return static_cast<int>(cudaStreamSynchronize(stream)); }

}  // namespace ferry::embed
