// The KV cache of `ferry demo`: `layers` x 2 (K, V) x `blocks` blocks of `block_bytes` each,
// laid out layer-major (layer, kv, block), the same shape on the producer and the consumer.
//
// The producer's blocks hold a pattern derived from (layer, kv, block, offset), so the
// consumer can check what it received without a second copy of the data. Blocks move to
// different ids on the two sides: the producer sends its blocks in a shuffled order, and
// block b of the producer lands in block dst_of[b] of the consumer (a random permutation).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry::tools {

struct KvShape {
  uint64_t layers = 32;
  uint64_t blocks = 512;
  uint64_t block_bytes = 32 * 1024;

  // REQUIRES: Validate().ok()
  uint64_t layer_bytes() const { return 2 * blocks * block_bytes; }
  uint64_t total_bytes() const { return layers * layer_bytes(); }
  uint64_t Offset(uint64_t layer, uint64_t kv, uint64_t block) const {
    return ((layer * 2 + kv) * blocks + block) * block_bytes;
  }
  // Non-zero sizes, block_bytes a multiple of 8, no overflow.
  Status Validate() const;
};

// Which producer block goes to which consumer block, and in what order the ops are posted.
struct BlockMapping {
  std::vector<uint64_t> send_order;  // producer block ids, shuffled
  std::vector<uint64_t> dst_of;      // dst_of[producer block] = consumer block
  std::vector<uint64_t> src_of;      // the inverse: src_of[consumer block] = producer block
};
BlockMapping MakeBlockMapping(uint64_t blocks, uint64_t seed);

// The ops of one layer (K and V of every block): local = producer, remote = consumer.
std::vector<TransferOp> PlanLayer(const KvShape& shape, const BlockMapping& mapping,
                                  uint64_t layer);

// The pattern word at byte `offset` (a multiple of 8) of producer block (layer, kv, block).
uint64_t PatternWord(uint64_t layer, uint64_t kv, uint64_t block, uint64_t offset);
// Fills one producer block's bytes. REQUIRES: out.size() == block_bytes, 8-byte aligned.
void FillBlock(uint64_t layer, uint64_t kv, uint64_t block, std::span<std::byte> out);
// Counts the 8-byte words of `got` that differ from producer block (layer, kv, block); the
// first differing word's byte offset goes to *first_bad (when any).
uint64_t CheckBlock(uint64_t layer, uint64_t kv, uint64_t block, std::span<const std::byte> got,
                    uint64_t* first_bad);

}  // namespace ferry::tools
