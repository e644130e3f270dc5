// Primality and consecutive primes for the embedding layout's head sizes.
//
// IsPrime is a deterministic Miller-Rabin test, exact for every 64-bit value. PrimesFrom(b, n)
// returns the first n primes >= b; results are cached per b (a model's layers ask for
// overlapping prefixes of the same sequence), so a later call costs only the new primes.
//
// Thread safety: both functions may be called from any thread; the cache has its own lock.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/status.h"

namespace ferry::embed {

bool IsPrime(uint64_t n);

// The first `count` primes p with p >= from, in increasing order.
// kInvalidArgument when a prime would exceed 2^63 (no realistic table gets near) or count is
// larger than kMaxPrimesPerBase.
inline constexpr uint64_t kMaxPrimesPerBase = 1u << 20;
Result<std::vector<uint64_t>> PrimesFrom(uint64_t from, uint64_t count);

}  // namespace ferry::embed
