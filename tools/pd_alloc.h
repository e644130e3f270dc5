// The block allocator of one `ferry pd` instance (the scheduler's role in vLLM): every TP rank
// of an instance holds a request in the same block ids, so the router allocates per instance
// and hands the ids to every rank. A free list, first in first out, so freed blocks come back
// in a scattered order, as in a server that has been running a while.
//
// Thread safety: none; the router's loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools::pd {

class BlockAllocator {
 public:
  explicit BlockAllocator(uint64_t blocks);

  // `count` blocks, or nothing when fewer are free (no partial allocation).
  std::optional<std::vector<uint64_t>> Allocate(uint64_t count);
  // kInvalidArgument for an id out of range or not allocated (nothing is freed then).
  Status Free(std::span<const uint64_t> blocks);

  uint64_t total() const { return static_cast<uint64_t>(allocated_.size()); }
  uint64_t free_count() const { return static_cast<uint64_t>(free_.size()); }
  uint64_t allocated() const { return total() - free_count(); }

 private:
  std::deque<uint64_t> free_;
  std::vector<bool> allocated_;
};

}  // namespace ferry::tools::pd
