// The n-gram embedding table's configuration (Config) and the layout derived from it (Layout),
// declared in ferry/embed.h: hash multipliers, head sizes and offsets, and the number of table
// rows. This header states their specification and holds the hash both use.
//
// The row-id specification, followed exactly (all arithmetic on uint64_t, wrapping):
//   G = (N - 1) H heads, head dim d = E / G.
//   SplitMix64(x): x += 0x9E3779B97F4A7C15; x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
//                  x = (x ^ (x >> 27)) * 0x94D049BB133111EB; return x ^ (x >> 31).
//   half = max(1, floor(floor((2^63 - 1) / V) / 2));
//   m_k = 2 * (SplitMix64(S + 10007 L + 0x9E3779B97F4A7C15 (k + 1)) mod half) + 1, k < N.
//   Head h (global head g = L G + h) has size_h = the (g+1)-th prime >= B (primes counted from
//   the first prime >= B), offset_h = size_0 + ... + size_(h-1); the table has
//   ceil(sum / P) * P rows. Row ids of a step: row_ids.h.
// A table row is one head's d values (row_bytes = d * element size, or d/2 + d/16 for NVFP4);
// a token's output is its G rows concatenated in head order: E values.
//
// Thread safety: Config and Layout are values; a const Layout may be shared by any threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/embed.h"
#include "ferry/status.h"

namespace ferry::embed {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

constexpr uint64_t SplitMix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Config, Dtype, FastMod and Layout: ferry/embed.h.

}  // namespace ferry::embed
