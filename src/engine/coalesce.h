// Merging a batch's adjacent pieces. KV blocks are often allocated in runs on both sides (a
// fresh request's blocks, a layer's K and V halves): a run of ops in which each one starts where
// the previous one ended, locally and remotely, moves the same bytes as one op over the whole
// run, with one descriptor, one message or one warp's worth of setup instead of one per block.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/engine.h"

namespace ferry::internal {

// Counts, in one pass beside the bounds checks, the ops that would join the op before them: empty
// ops, and ops that continue the previous non-empty op on both sides.
class JoinCounter {
 public:
  void Add(const TransferOp& o) {
    if (o.size == 0) {
      ++joins_;
      return;
    }
    if (any_ && o.local_offset == local_end_ && o.remote_offset == remote_end_) ++joins_;
    any_ = true;
    local_end_ = o.local_offset + o.size;  // the caller checked both ends against their regions
    remote_end_ = o.remote_offset + o.size;
  }
  uint64_t joins() const { return joins_; }

 private:
  bool any_ = false;
  uint64_t local_end_ = 0;
  uint64_t remote_end_ = 0;
  uint64_t joins_ = 0;
};

// Whether merging pays for the copy of the op list it takes: at least one op in eight joins.
inline bool WorthCoalescing(uint64_t joins, uint64_t ops) { return joins > 0 && joins * 8 >= ops; }

// The batch with every run merged into one op and empty ops dropped. Every byte keeps its local
// and remote offset; ops stay in their order. The ops must lie inside their regions (no sum
// overflows then).
std::vector<TransferOp> CoalesceOps(std::span<const TransferOp> ops);
// The same in place: the merged batch is the first N ops of `ops`; returns N.
size_t CoalesceInPlace(std::span<TransferOp> ops);

}  // namespace ferry::internal
