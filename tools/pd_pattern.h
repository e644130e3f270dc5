// The KV content of `ferry pd`: what the prefill side writes and the decode side checks.
//
// Content is keyed by logical coordinates, never by block ids or ranks: byte i of the vector of
// (request, layer, K or V, token position, model head) is a hash of those five and i. So a
// decode rank checks exactly the heads it holds, for every token of the request, whatever the
// TP sizes, block sizes and tensor orders of the two sides.
//
// Where a vector lives follows kv.h's TensorLayout: scheduler block blocks[t / block_tokens],
// kernel block and token within it, local head = model head - first head of the rank.
//
// Thread safety: pure functions; Fill/Check touch only the bytes of the request's tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/kv.h"

namespace ferry::tools::pd {

struct VectorKey {
  uint64_t request = 0;
  uint32_t layer = 0;
  uint32_t kv = 0;  // 0 = K (or the MLA latent), 1 = V
  uint64_t token = 0;
  uint32_t head = 0;  // the model's head, not the rank's
};

// The 8 bytes at byte offset 8 * word of the vector.
uint64_t PatternWord(const VectorKey& key, uint64_t word);
// Fills `out` (one vector: head_dim * dtype bytes) with the pattern.
void FillVector(const VectorKey& key, std::span<std::byte> out);
// The number of bytes of `got` that differ from the pattern.
uint64_t CheckVector(const VectorKey& key, std::span<const std::byte> got);

// A worker's cache as this process sees it: the layout and a host pointer to each region
// (the regions themselves, or host mirrors of GPU regions).
struct CacheView {
  const kv::CacheLayout* layout = nullptr;
  std::vector<std::byte*> regions;  // layout->region_bytes.size() entries
  uint32_t first_head = 0;          // the model's heads this rank holds
  uint32_t heads = 0;
};

// The byte offset, inside its region, of (token, local head) of tensor `t` for a request in
// scheduler blocks `blocks`. REQUIRES: token < blocks.size() * block_tokens.
uint64_t VectorOffset(const kv::CacheLayout& layout, const kv::TensorLayout& t,
                      std::span<const uint64_t> blocks, uint64_t token, uint32_t local_head);
// The byte range [begin, end) of scheduler block `block` of tensor `t` in its region (every
// token and head it may hold), for staging a block to or from GPU memory.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};
ByteRange BlockRange(const kv::CacheLayout& layout, const kv::TensorLayout& t, uint32_t heads,
                     uint64_t block);

// Writes the pattern of layer `layer` of `request` (its first `tokens` tokens) into `view`.
// REQUIRES: blocks hold the tokens, and lie below layout.num_blocks.
void FillLayer(const CacheView& view, uint64_t request, uint32_t layer,
               std::span<const uint64_t> blocks, uint64_t tokens);

struct CheckReport {
  uint64_t bytes_checked = 0;
  uint64_t bad_bytes = 0;
  uint64_t bad_vectors = 0;
  std::string first_bad;  // "layer 3 V token 17 head 2: 12 bytes differ", for humans
};
// Checks every layer of `request` in `view`: tokens [first_token, tokens), held in `blocks`
// from first_token on (after a prefix hit of first_token tokens, a multiple of the block size).
CheckReport CheckRequest(const CacheView& view, uint64_t request, std::span<const uint64_t> blocks,
                         uint64_t tokens, uint64_t first_token = 0);

}  // namespace ferry::tools::pd
