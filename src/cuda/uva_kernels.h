// The UVA-mode kernel of the embedding offload: row ids (bit-exact with embed's
// RowIdsOfRange) and row gathering on the GPU, reading rows straight from page-locked host
// memory. The interface holds no CUDA type so that plain C++ files can include it;
// src/embed/uva.h is the API. Without CUDA (uva_kernels_none.cc) the launch fails.
//
// Thread safety: launches may be made from any thread; a launch's order is its stream's.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ferry::cuda {

inline constexpr int kUvaMaxNgram = 16;

// One head's constants, in device memory: size, FastMod magic, first row.
struct UvaHead {
  uint64_t size;
  uint64_t magic;
  uint64_t offset;
};

// Error kinds the kernel records in *error (the first one wins; 0: none).
// The codes they become match ValidateStep's: kOutOfRange for ids >= V and a last query start
// past num_tokens, kInvalidArgument for a first one other than 0 or a decreasing one.
enum UvaError : int32_t {
  kUvaOk = 0,
  kUvaIdOutOfRange = 1,
  kUvaBadQueryStart = 2,
  kUvaQueryStartPastEnd = 3,
};

struct UvaStepArgs {
  const int32_t* tokens;       // device-visible, num_tokens
  const int32_t* query_start;  // device-visible, num_reqs + 1
  const int32_t* context;      // device-visible, num_reqs * (ngram - 1)
  int64_t num_tokens;
  int64_t num_reqs;
  const uint8_t* table;  // mapped page-locked host memory (UVA), table_rows rows
  uint64_t table_rows;
  uint64_t row_bytes;
  uint8_t* dst;          // device memory, num_tokens * num_heads * row_bytes
  const UvaHead* heads;  // device memory, num_heads
  int32_t num_heads;
  int32_t heads_per_ngram;
  int32_t ngram;
  int64_t vocab_size;
  uint64_t eos;
  uint64_t multipliers[kUvaMaxNgram];
  int32_t* error;  // device memory, one int32 set to 0 before the launch
};

// Enqueues the kernel on `stream`; returns the launch's cudaError_t (0 = success).
int LaunchUvaGather(const UvaStepArgs& args, CUstream_st* stream);

// What a launch returns in a build without CUDA (never a cudaError_t).
inline constexpr int kLaunchUnsupported = -1;

// A stand-in for a model layer's kernels (gpu::Stream::Spin): enqueues one single-thread
// kernel on `stream` that spins on the GPU's global timer until `nanoseconds` have passed since
// it started. Kept here, beside the other small kernel, so that no new .cu file is compiled.
// Returns the launch's cudaError_t (0 = success), or kLaunchUnsupported without CUDA.
int LaunchSpin(uint64_t nanoseconds, CUstream_st* stream);

}  // namespace ferry::cuda
