// The Gatherer's row copy loop (Gatherer itself and GatherOptions: ferry/embed.h).
//
// Thread safety: GatherRows may run concurrently on distinct destinations.
#pragma once

#include <cstdint>

#include "ferry/embed.h"

namespace ferry::embed {

// The row copy loop of one range of a gather: rows ids[0..count) to dst, with the prefetch
// and store options of `options`. Returns the index of the first row id that is out of range
// (that row is zeroed), or -1. Used by Gatherer and by benchmarks. Streaming stores are the
// widest the CPU has (StreamStoreWidth), at most `max_stream_width` bytes, narrowed until dst
// and the row size are multiples of the width; below 16 bytes the rows take memcpy.
int64_t GatherRows(const Table& table, const uint64_t* ids, int64_t count, uint8_t* dst,
                   const GatherOptions& options, int max_stream_width = 64);

// The width in bytes of this CPU's widest non-temporal store that GatherRows uses: 64
// (AVX-512), 32 (AVX2) or 16 (SSE2); 0 where GatherRows has no streaming stores.
int StreamStoreWidth();

}  // namespace ferry::embed
