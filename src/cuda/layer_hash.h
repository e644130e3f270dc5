// The per-layer KV checksum's word mix and the kernel that sums it over a layer in GPU memory
// (src/kv/checksum.h defines the checksum and computes it for host memory with the same mix).
// The interface holds no CUDA type so that plain C++ files can include it. Without CUDA
// (layer_hash_none.cc) the launch fails.
//
// The checksum is the sum mod 2^64, over every 8-byte word of every (token, head, K/V) slice
// that moves, of LayerHashWord(seed, index, word): `index` is the word's logical place
// (((token * total_heads + head) * 2 + kv) * words_per_head + word, tokens counted from the
// first that moves, heads in model numbering), so the sum does not depend on the order the
// words are visited in nor on where they sit in memory: a GPU sums them in parallel and gets
// what the host gets. The last word of a slice whose bytes are not a multiple of 8 is read
// little-endian and padded with zero bytes.
//
// Thread safety: launches may be made from any thread; a launch's order is its stream's.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t is CUstream_st*

#if defined(__CUDACC__)
#define FERRY_LAYER_HASH_HD __host__ __device__
#else
#define FERRY_LAYER_HASH_HD
#endif

namespace ferry::cuda {

// MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends on every input
// bit.
FERRY_LAYER_HASH_HD inline uint64_t LayerHashFmix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline constexpr uint64_t kLayerHashStep = 0x9e3779b97f4a7c15ULL;  // odd: i -> i * step is a bijection

// The key of layer `layer`: the same bytes in two layers hash differently.
FERRY_LAYER_HASH_HD inline uint64_t LayerHashSeed(uint32_t layer) {
  return LayerHashFmix(0x6665727279ULL ^ (uint64_t{layer} << 32 | layer));
}

// One word's term. `key` is seed + index * kLayerHashStep (the host adds the step word by
// word). Swapping two words a (at i) and b (at j) leaves the sum unchanged only when
// a ^ b == key_i ^ key_j, which data does not arrange by accident.
FERRY_LAYER_HASH_HD inline uint64_t LayerHashTerm(uint64_t key, uint64_t word) { return LayerHashFmix(word ^ key); }

// One tensor (K or V) of the layer, as kv::TensorLayout, with its region's address and offset
// folded into `base` (a device pointer).
struct LayerHashTensor {
  const uint8_t* base;
  uint64_t block_stride;
  uint64_t token_stride;
  uint64_t head_stride;  // 0 for MLA (one latent per token)
};

struct LayerHashArgs {
  LayerHashTensor tensors[2];  // K, then V
  uint32_t num_tensors;        // 1 (MLA) or 2
  const uint64_t* blocks;      // device memory: scheduler block ids holding tokens [0, tokens)
  uint64_t tokens;
  uint64_t block_tokens;       // tokens of a scheduler block
  uint64_t kernel_block;       // tokens of a kernel block (divides block_tokens)
  uint32_t head_begin;         // model heads [head_begin, head_begin + head_count)
  uint32_t head_count;
  uint32_t local_first;        // this side's index of head_begin among the heads it holds
  uint32_t total_heads;        // the model's KV heads (1 for MLA)
  uint64_t head_bytes;         // bytes of one (token, head) slice; > 0
  uint64_t seed;               // LayerHashSeed(layer)
  unsigned long long* out;     // device memory, zero before the launch; the sum is added to it
};

// Enqueues the kernel on `stream` (REQUIRES: the current device is the stream's, and every
// slice the arguments name lies in device-readable memory). Returns the launch's cudaError_t
// (0 = success); a launch of no slices enqueues nothing and returns 0.
int LaunchLayerHash(const LayerHashArgs& args, CUstream_st* stream);

// What a launch returns in a build without CUDA (never a cudaError_t).
inline constexpr int kLayerHashUnsupported = -1;

}  // namespace ferry::cuda
