#include "pd_pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace ferry::tools::pd {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t KeySeed(const VectorKey& k) {
  uint64_t h = Mix(k.request);
  h = Mix(h ^ (uint64_t{k.layer} << 1 | k.kv));
  h = Mix(h ^ k.token);
  return Mix(h ^ k.head);
}

const kv::TensorLayout& Tensor(const kv::LayerLayout& l, uint32_t kv) {
  return kv == 0 ? l.k : *l.v;
}

}  // namespace

uint64_t PatternWord(const VectorKey& key, uint64_t word) { return Mix(KeySeed(key) + word); }

void FillVector(const VectorKey& key, std::span<std::byte> out) {
  const uint64_t seed = KeySeed(key);
  for (size_t at = 0, word = 0; at < out.size(); at += 8, ++word) {
    const uint64_t w = Mix(seed + word);
    std::memcpy(out.data() + at, &w, std::min<size_t>(8, out.size() - at));
  }
}

uint64_t CheckVector(const VectorKey& key, std::span<const std::byte> got) {
  const uint64_t seed = KeySeed(key);
  uint64_t bad = 0;
  for (size_t at = 0, word = 0; at < got.size(); at += 8, ++word) {
    const uint64_t w = Mix(seed + word);
    const size_t n = std::min<size_t>(8, got.size() - at);
    if (std::memcmp(got.data() + at, &w, n) == 0) continue;
    for (size_t i = 0; i < n; ++i)
      bad += got[at + i] != reinterpret_cast<const std::byte*>(&w)[i] ? 1 : 0;
  }
  return bad;
}

uint64_t VectorOffset(const kv::CacheLayout& layout, const kv::TensorLayout& t,
                      std::span<const uint64_t> blocks, uint64_t token, uint32_t local_head) {
  const uint64_t bt = layout.block_tokens;
  const uint64_t kbt = layout.kernel_block_tokens ? layout.kernel_block_tokens : bt;
  const uint64_t in_block = token % bt;
  const uint64_t kernel_block = blocks[token / bt] * (bt / kbt) + in_block / kbt;
  return t.offset + kernel_block * t.block_stride + (in_block % kbt) * t.token_stride +
         uint64_t{local_head} * t.head_stride;
}

ByteRange BlockRange(const kv::CacheLayout& layout, const kv::TensorLayout& t, uint32_t heads,
                     uint64_t block) {
  const uint64_t bt = layout.block_tokens;
  const uint64_t kbt = layout.kernel_block_tokens ? layout.kernel_block_tokens : bt;
  const uint64_t per = bt / kbt;
  const uint64_t head_bytes = uint64_t{layout.head_dim} * layout.dtype_bytes;
  ByteRange r;
  r.begin = t.offset + block * per * t.block_stride;
  r.end = t.offset + (block * per + per - 1) * t.block_stride + (kbt - 1) * t.token_stride +
          uint64_t{heads == 0 ? 0 : heads - 1} * t.head_stride + head_bytes;
  return r;
}

void FillLayer(const CacheView& view, uint64_t request, uint32_t layer,
               std::span<const uint64_t> blocks, uint64_t tokens) {
  const kv::CacheLayout& layout = *view.layout;
  const kv::LayerLayout& l = layout.layers[layer];
  const uint64_t head_bytes = uint64_t{layout.head_dim} * layout.dtype_bytes;
  for (uint32_t kv = 0; kv < (l.v ? 2u : 1u); ++kv) {
    const kv::TensorLayout& t = Tensor(l, kv);
    std::byte* base = view.regions[t.region];
    for (uint64_t token = 0; token < tokens; ++token)
      for (uint32_t h = 0; h < view.heads; ++h)
        FillVector({request, layer, kv, token, view.first_head + h},
                   {base + VectorOffset(layout, t, blocks, token, h), head_bytes});
  }
}

CheckReport CheckRequest(const CacheView& view, uint64_t request, std::span<const uint64_t> blocks,
                         uint64_t tokens, uint64_t first_token) {
  const kv::CacheLayout& layout = *view.layout;
  const uint64_t head_bytes = uint64_t{layout.head_dim} * layout.dtype_bytes;
  CheckReport r;
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    const kv::LayerLayout& l = layout.layers[layer];
    for (uint32_t kv = 0; kv < (l.v ? 2u : 1u); ++kv) {
      const kv::TensorLayout& t = Tensor(l, kv);
      const std::byte* base = view.regions[t.region];
      for (uint64_t token = first_token; token < tokens; ++token) {
        for (uint32_t h = 0; h < view.heads; ++h) {
          // The content is the logical token's; its place counts from the first block given.
          const VectorKey key{request, layer, kv, token, view.first_head + h};
          const uint64_t bad = CheckVector(
              key, {base + VectorOffset(layout, t, blocks, token - first_token, h), head_bytes});
          r.bytes_checked += head_bytes;
          if (bad == 0) continue;
          if (r.bad_vectors == 0)
            r.first_bad = fmt::format("layer {} {} token {} head {}: {} of {} bytes differ", layer,
                                      l.v ? (kv == 0 ? "K" : "V") : "latent", token, key.head, bad,
                                      head_bytes);
          r.bad_bytes += bad;
          ++r.bad_vectors;
        }
      }
    }
  }
  return r;
}

}  // namespace ferry::tools::pd
