// Per-layer checksums of KV in host memory: a hash of the bytes of every (token, head, K/V) a
// transfer moves, taken in the logical order (token, then head, then K before V), so that the
// producer and the consumer compute the same value from their own layouts and blocks.
//
// Thread safety: pure functions over memory the caller keeps stable while they run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ferry/kv.h"
#include "kv/planner.h"

namespace ferry::kv {

// `bases[i]` is the address of region i in this process. `blocks` hold the tokens [0, tokens)
// that move; `heads` are model heads this side holds. REQUIRES: a validated layout, blocks in
// range and tokens within them (as BuildPlan checked).
uint64_t LayerChecksum(const CacheLayout& layout, std::span<const std::byte* const> bases,
                       std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer);

}  // namespace ferry::kv
