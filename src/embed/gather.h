// The Gatherer's row copy loop (Gatherer itself and GatherOptions: ferry/embed.h).
//
// Thread safety: GatherRows may run concurrently on distinct destinations.
#pragma once

#include <cstdint>

#include "ferry/embed.h"

namespace ferry::embed {

// The row copy loop of one range of a gather: rows ids[0..count) to dst, with the prefetch
// and store options of `options`. Returns the index of the first row id that is out of range
// (that row is zeroed), or -1. Used by Gatherer and by benchmarks.
int64_t GatherRows(const Table& table, const uint64_t* ids, int64_t count, uint8_t* dst,
                   const GatherOptions& options);

}  // namespace ferry::embed
