#include "kv/checksum.h"

#include <cstring>

namespace ferry::kv {
namespace {

inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 32);
}

uint64_t HashBytes(uint64_t h, const std::byte* p, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    h = Mix(h, v);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return Mix(h, tail ^ (n << 56));
}

}  // namespace

uint64_t LayerChecksum(const CacheLayout& layout, std::span<const std::byte* const> bases,
                       std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer) {
  const LayerLayout& l = layout.layers[layer];
  const uint64_t kb = layout.kernel_block();
  const uint64_t ratio = layout.block_tokens / kb;
  const uint64_t hb = layout.head_bytes();
  uint64_t h = Mix(0, layer);
  for (uint64_t t = 0; t < tokens; ++t) {
    const uint64_t in = t % layout.block_tokens;
    const uint64_t kblock = blocks[t / layout.block_tokens] * ratio + in / kb;
    for (uint32_t head = heads.begin; head < heads.end; ++head) {
      const uint64_t local = layout.mla ? 0 : head - layout.first_head();
      for (const TensorLayout* tl : {&l.k, l.v ? &*l.v : nullptr}) {
        if (tl == nullptr) continue;
        const std::byte* p = bases[tl->region] + tl->offset + kblock * tl->block_stride + (in % kb) * tl->token_stride +
                             local * tl->head_stride;
        h = HashBytes(h, p, hb);
      }
    }
  }
  return h;
}

}  // namespace ferry::kv
