// FastMod: x mod d for a fixed 64-bit divisor by one 128-bit multiply (Barrett reduction),
// exact for every x and every d >= 1.
//
// With m = floor((2^64 - 1) / d), q = floor(x m / 2^64) is floor(x / d) or one less (the error
// of x m / 2^64 against x / d is below x / 2^64 < 1), so x - q d lies in [0, 2d) and one
// conditional subtraction finishes.
//
// Thread safety: a value; Mod() is const.
#pragma once

#include <cstdint>

namespace ferry::embed {

struct FastMod {
  uint64_t divisor = 1;
  uint64_t magic = ~0ull;

  static constexpr FastMod For(uint64_t d) { return FastMod{d, ~0ull / d}; }  // REQUIRES: d >= 1

  constexpr uint64_t Mod(uint64_t x) const {
    uint64_t q = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * magic) >> 64);
    uint64_t r = x - q * divisor;
    return r >= divisor ? r - divisor : r;
  }
};

}  // namespace ferry::embed
