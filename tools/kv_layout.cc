#include "kv_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

namespace ferry::tools {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t BlockSeed(uint64_t layer, uint64_t kv, uint64_t block) {
  return Mix(Mix(Mix(layer) ^ kv) ^ block);
}

// Word i of a block: distinct per block (seed) and per position (an odd multiplier of i).
inline uint64_t Word(uint64_t seed, uint64_t i) { return seed ^ (i * 0xD1B54A32D192ED03ull); }

}  // namespace

Status KvShape::Validate() const {
  if (layers == 0 || blocks == 0 || block_bytes == 0)
    return Status(Code::kInvalidArgument, "layers, blocks and block bytes must be positive");
  if (block_bytes % 8 != 0)
    return Status(Code::kInvalidArgument, "block bytes must be a multiple of 8");
  uint64_t total = 0;
  if (__builtin_mul_overflow(layers, uint64_t{2}, &total) ||
      __builtin_mul_overflow(total, blocks, &total) ||
      __builtin_mul_overflow(total, block_bytes, &total))
    return Status(Code::kInvalidArgument, "the KV cache size overflows 64 bits");
  return Status::Ok();
}

BlockMapping MakeBlockMapping(uint64_t blocks, uint64_t seed) {
  BlockMapping m;
  std::mt19937_64 rng(seed);
  m.send_order.resize(blocks);
  std::iota(m.send_order.begin(), m.send_order.end(), 0);
  std::shuffle(m.send_order.begin(), m.send_order.end(), rng);
  m.dst_of.resize(blocks);
  std::iota(m.dst_of.begin(), m.dst_of.end(), 0);
  std::shuffle(m.dst_of.begin(), m.dst_of.end(), rng);
  m.src_of.resize(blocks);
  for (uint64_t b = 0; b < blocks; ++b) m.src_of[m.dst_of[b]] = b;
  return m;
}

std::vector<TransferOp> PlanLayer(const KvShape& shape, const BlockMapping& mapping,
                                  uint64_t layer) {
  std::vector<TransferOp> ops;
  ops.reserve(2 * shape.blocks);
  for (uint64_t kv = 0; kv < 2; ++kv) {
    for (uint64_t src : mapping.send_order) {
      ops.push_back({shape.Offset(layer, kv, src), shape.Offset(layer, kv, mapping.dst_of[src]),
                     shape.block_bytes});
    }
  }
  return ops;
}

uint64_t PatternWord(uint64_t layer, uint64_t kv, uint64_t block, uint64_t offset) {
  return Word(BlockSeed(layer, kv, block), offset / 8);
}

void FillBlock(uint64_t layer, uint64_t kv, uint64_t block, std::span<std::byte> out) {
  const uint64_t seed = BlockSeed(layer, kv, block);
  auto* words = reinterpret_cast<uint64_t*>(out.data());
  const uint64_t n = out.size() / 8;
  for (uint64_t i = 0; i < n; ++i) words[i] = Word(seed, i);
}

uint64_t CheckBlock(uint64_t layer, uint64_t kv, uint64_t block, std::span<const std::byte> got,
                    uint64_t* first_bad) {
  const uint64_t seed = BlockSeed(layer, kv, block);
  const auto* words = reinterpret_cast<const uint64_t*>(got.data());
  const uint64_t n = got.size() / 8;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += words[i] != Word(seed, i);
  if (bad != 0 && first_bad != nullptr) {
    for (uint64_t i = 0; i < n; ++i) {
      if (words[i] != Word(seed, i)) {
        *first_bad = i * 8;
        break;
      }
    }
  }
  return bad;
}

}  // namespace ferry::tools
