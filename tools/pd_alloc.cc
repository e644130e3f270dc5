#include "pd_alloc.h"

#include <fmt/format.h>

#include <set>

namespace ferry::tools::pd {

BlockAllocator::BlockAllocator(uint64_t blocks) : allocated_(blocks, false) {
  for (uint64_t b = 0; b < blocks; ++b) free_.push_back(b);
}

std::optional<std::vector<uint64_t>> BlockAllocator::Allocate(uint64_t count) {
  if (count > free_.size()) return std::nullopt;
  std::vector<uint64_t> out(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(count));
  free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(count));
  for (uint64_t b : out) allocated_[b] = true;
  return out;
}

Status BlockAllocator::Free(std::span<const uint64_t> blocks) {
  std::set<uint64_t> seen;
  for (uint64_t b : blocks) {
    if (b >= allocated_.size() || !allocated_[b] || !seen.insert(b).second)
      return Status(Code::kInvalidArgument, fmt::format("block {} is not allocated", b));
  }
  for (uint64_t b : blocks) {
    allocated_[b] = false;
    free_.push_back(b);
  }
  return Status::Ok();
}

}  // namespace ferry::tools::pd
