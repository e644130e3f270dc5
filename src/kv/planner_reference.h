// Test-only: a naive planner that computes every (token, head) unit's source and destination
// byte straight from the layout formula, one unit at a time, with none of the planner's code
// (its own head routing, no segments, no merging). The planner tests compare against it and
// the planner benchmark runs it side by side.
#pragma once

#include <cstdint>
#include <optional>

#include "ferry/kv.h"
#include "kv/planner.h"

namespace ferry::kv::reference {

struct Unit {
  uint32_t layer;
  uint32_t src_region;
  uint64_t src;
  uint32_t dst_region;
  uint64_t dst;
  friend auto operator<=>(const Unit&, const Unit&) = default;
};

// The heads destination rank `dst` reads from source rank `src`, from the spec in planner.h:
// for each head the destination holds, the (dst mod n)-th of its n holders sends it.
inline std::optional<std::pair<uint32_t, uint32_t>> Route(const CacheLayout& s, const CacheLayout& d) {
  const uint64_t heads = s.mla ? 1 : s.total_kv_heads;
  auto first = [&](const CacheLayout& c) { return s.mla ? 0 : c.tp_rank * heads / c.tp_size; };
  auto count = [&](const CacheLayout& c) { return s.mla || c.tp_size >= heads ? 1 : heads / c.tp_size; };
  uint32_t begin = 0, end = 0;
  for (uint64_t h = first(d); h < first(d) + count(d); ++h) {
    uint64_t holders[1024];
    uint64_t n = 0;
    for (uint64_t r = 0; r < s.tp_size; ++r) {
      CacheLayout probe = s;
      probe.tp_rank = static_cast<uint32_t>(r);
      if (h >= first(probe) && h < first(probe) + count(probe)) holders[n++] = r;
    }
    if (holders[d.tp_rank % n] != s.tp_rank) continue;
    if (begin == end) begin = static_cast<uint32_t>(h);
    end = static_cast<uint32_t>(h + 1);
  }
  if (begin == end) return std::nullopt;
  return std::pair{begin, end};
}

// Calls f(Unit) for every head_bytes unit the request moves (source -> destination).
template <typename F>
void ForEachUnit(const PlanInput& in, uint64_t num_tokens, F&& f) {
  const CacheLayout& s = *in.src;
  const CacheLayout& d = *in.dst;
  const auto route = Route(s, d);
  if (!route) return;
  const uint32_t end_layer = in.layer_count ? in.first_layer + in.layer_count : s.num_layers;
  auto place = [](const CacheLayout& c, const TensorLayout& t, std::span<const uint64_t> blocks,
                  uint64_t token, uint64_t head) {
    const uint64_t kbt = c.kernel_block_tokens ? c.kernel_block_tokens : c.block_tokens;
    const uint64_t first = c.mla ? 0 : uint64_t{c.tp_rank} * c.total_kv_heads / c.tp_size;
    const uint64_t within = token % c.block_tokens;
    const uint64_t kblock = blocks[token / c.block_tokens] * (c.block_tokens / kbt) + within / kbt;
    return t.offset + kblock * t.block_stride + (within % kbt) * t.token_stride +
           (head - first) * t.head_stride;
  };
  for (uint32_t l = in.first_layer; l < end_layer; ++l) {
    for (int tensor = 0; tensor < (s.mla ? 1 : 2); ++tensor) {
      const TensorLayout& st = tensor == 0 ? s.layers[l].k : *s.layers[l].v;
      const TensorLayout& dt = tensor == 0 ? d.layers[l].k : *d.layers[l].v;
      for (uint64_t t = 0; t < num_tokens; ++t) {
        for (uint32_t h = route->first; h < route->second; ++h) {
          f(Unit{l, st.region, place(s, st, in.src_blocks, t, h), dt.region,
                 place(d, dt, in.dst_blocks, t, h)});
        }
      }
    }
  }
}

}  // namespace ferry::kv::reference
