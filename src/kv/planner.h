// The KV planner: which heads each producer rank sends to each consumer rank, and, for one
// request, the byte ranges that move per layer, with runs adjacent on both sides merged.
//
// Heads. The model's KV heads [0, H) are split over a side's TP ranks: rank r of T holds
// [r*H/T, (r+1)*H/T) when T <= H, or the single head r*H/T (replicated) when T > H; MLA has one
// latent "head" that every rank holds. For each destination rank d and each head h it needs,
// the source rank is the (d mod n)-th of the n source ranks holding h, so replicated heads are
// read from different ranks (spreading the load) and never twice.
//
// Partners. Source rank s and destination rank d are partners when s sends d some heads, and
// also, when s sends to nobody (replicated KV with a smaller destination TP), for d = s mod T_d:
// partners exchange the connector's messages for every request (allocation, completion,
// release), so every rank learns when a request ended, even one that moves no byte.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/kv.h"
#include "ferry/types.h"

namespace ferry::kv {

struct HeadRange {
  uint32_t begin = 0;
  uint32_t end = 0;
  bool empty() const { return end <= begin; }
  uint32_t size() const { return empty() ? 0 : end - begin; }
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

// The heads held by rank `tp_rank` of `tp_size` (REQUIRES: a validated split).
HeadRange HeadsOf(uint32_t total_heads, bool mla, uint32_t tp_size, uint32_t tp_rank);

// The TP shapes of the two sides of a transfer (source = producer, destination = consumer).
struct TpPair {
  uint32_t total_heads = 1;
  bool mla = false;
  uint32_t src_tp = 1;
  uint32_t dst_tp = 1;
};
// kInvalidArgument unless both splits are valid (heads divisible by TP or TP by heads).
Status ValidateTpPair(const TpPair& pair);

// The heads source rank `src` sends to destination rank `dst` (empty when none).
HeadRange RouteHeads(const TpPair& pair, uint32_t src, uint32_t dst);
// The partners of a source rank, and of a destination rank, in increasing rank order.
std::vector<uint32_t> DestinationsOf(const TpPair& pair, uint32_t src);
std::vector<uint32_t> SourcesOf(const TpPair& pair, uint32_t dst);

struct PlanInput {
  const CacheLayout* src = nullptr;  // the producer rank's layout
  const CacheLayout* dst = nullptr;  // the consumer rank's layout
  // Scheduler block ids holding the request's tokens on each side, in token order (after a
  // prefix hit, both lists start at the first token that moves, on a block boundary of both).
  std::span<const uint64_t> src_blocks;
  std::span<const uint64_t> dst_blocks;
  // Tokens to move; 0 = every token both lists can hold (the smaller capacity).
  uint64_t num_tokens = 0;
  // Who posts the ops: the source (write mode: local = src) or the destination (read mode).
  bool poster_is_src = true;
  // Layers to plan: [first_layer, first_layer + layer_count); layer_count 0 = to the last.
  uint32_t first_layer = 0;
  uint32_t layer_count = 0;
};

// The ops of one (layer, local region, remote region): ops[begin, end) of Plan::ops.
struct OpGroup {
  uint32_t layer = 0;
  uint32_t local_region = 0;
  uint32_t remote_region = 0;
  size_t begin = 0;
  size_t end = 0;
  uint64_t bytes = 0;
};

struct Plan {
  std::vector<TransferOp> ops;    // local = the poster's side
  std::vector<OpGroup> groups;    // in layer order; several per layer when K and V differ in region
  uint64_t bytes = 0;
  HeadRange heads;                // the heads that move (model numbering)
  uint64_t tokens = 0;
  void Clear() { ops.clear(); groups.clear(); bytes = 0; heads = {}; tokens = 0; }
};

// Plans the request's transfer between input.src's rank and input.dst's rank (REQUIRES: both
// layouts validated). kInvalidArgument for incompatible layouts (CheckCompatible) or invalid
// TP splits; kOutOfRange for a block id beyond a side's num_blocks or more tokens than the
// lists hold. An empty route (no heads between the two ranks) or zero tokens gives an empty
// plan. `out` is cleared first and its capacity reused.
Status BuildPlan(const PlanInput& input, Plan* out);

}  // namespace ferry::kv
