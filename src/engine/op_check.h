// Checking a batch's ops against the two regions of its session, on the engine's own copy of
// them. A batch of many thousand ops (a KV transfer of small blocks over a GPU path, where the
// copy itself takes well under a millisecond) is checked by a few threads at once: the copy of
// the caller's ops and the check are one pass over each share, so the GPU starts sooner.
//
// Thread safety: CheckOps may be called from any thread; `in` must not overlap `out` except
// when they are the same array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/types.h"

namespace ferry::internal {

struct OpCheck {
  uint64_t total = 0;  // bytes of the batch
  uint64_t joins = 0;  // as JoinCounter counts them (engine/coalesce.h)
  uint64_t max_size = 0;  // the longest op's size
  bool ok = true;      // every op inside both regions, and `total` did not overflow
};

// Batches of at least this many ops are shared out among the checking threads.
inline constexpr size_t kParallelCheckOps = 16384;

// Copies in[i] to out[i] (`out` may be `in`'s own storage, for ops the engine owns) and checks
// the copy: both ends inside [0, local_size) and [0, remote_size), sizes summed without overflow.
// When !ok, the caller finds the first offending op in `out` (the copy just checked) for its
// message. Large batches use the process's checking threads (at most 8, started on first use);
// when none can start, or they are busy, the calling thread does the rest itself.
OpCheck CopyAndCheckOps(std::span<const TransferOp> in, TransferOp* out, uint64_t local_size,
                        uint64_t remote_size);

}  // namespace ferry::internal
