// The per-token logic of the UVA kernel, shared by the kernel (nvcc, device code) and a host
// test that checks it against the CPU path on machines without a GPU
// (src/embed/uva_device_test.cc).
// Plain functions of UvaStepArgs; every read is bounds-checked against the step's sizes.
#pragma once

#include <cstdint>

#include "cuda/uva_kernels.h"

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__ __forceinline__
#else
#define FERRY_HD inline
#endif

namespace ferry::cuda::uva {

inline constexpr uint64_t kNoRow = ~0ull;

FERRY_HD uint64_t MulHi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

FERRY_HD uint64_t Mod(uint64_t x, const UvaHead& head) {
  const uint64_t r = x - MulHi(x, head.magic) * head.size;
  return r >= head.size ? r - head.size : r;
}

FERRY_HD uint64_t Id(int32_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

// Where token t stands: its request r and index i in it, or padding (returns false): past the
// last request, or (with unsound query starts) anywhere a read could leave the inputs.
FERRY_HD bool FindToken(const UvaStepArgs& a, int64_t t, int64_t* r_out, int64_t* i_out) {
  int64_t lo = 0, hi = a.num_reqs + 1;  // the first index whose start is past t
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (a.query_start[mid] <= t)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t r = lo - 1;
  if (r < 0 || r >= a.num_reqs || t >= a.query_start[r + 1] || a.query_start[r] < 0) return false;
  *r_out = r;
  *i_out = t - a.query_start[r];
  return true;
}

// x[p - s] of token t (request r, index i): a step token when i >= s, else the context.
FERRY_HD int32_t Raw(const UvaStepArgs& a, int64_t t, int64_t r, int64_t i, int s) {
  return i >= s ? a.tokens[t - s] : a.context[r * (a.ngram - 1) + a.ngram - 1 + i - s];
}

// True when every id token t reads is inside the vocabulary.
FERRY_HD bool IdsInVocabulary(const UvaStepArgs& a, int64_t t, int64_t r, int64_t i) {
  bool ok = true;
  for (int s = 0; s < a.ngram; ++s) ok = ok && Raw(a, t, r, i, s) < a.vocab_size;
  return ok;
}

// The row of head h of token t, as RowIdsOfRange computes it.
FERRY_HD uint64_t RowId(const UvaStepArgs& a, int64_t t, int64_t r, int64_t i, int h) {
  const int order = h / a.heads_per_ngram + 2;  // the n of head h's n-gram
  uint64_t mix = Id(Raw(a, t, r, i, 0)) * a.multipliers[0];
  bool blocked = false;  // an EOS among x[p-s+1 .. p-1]
  for (int s = 1; s < order; ++s) {
    const uint64_t v = Id(Raw(a, t, r, i, s));
    mix ^= (blocked ? a.eos : v) * a.multipliers[s];
    blocked = blocked || v == a.eos;
  }
  return Mod(mix, a.heads[h]) + a.heads[h].offset;
}

}  // namespace ferry::cuda::uva
