// Region: a registered local memory region as the engine and the transports see it.
//
// A transfer acquires every region it touches for as long as any part of it runs; deregistering
// a region marks it dead (new transfers fail) and then waits for the transfers still using it.
//
// Thread safety: Acquire/Release/Retire may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/deadline.h"
#include "ferry/descriptors.h"
#include "ferry/status.h"

namespace ferry::internal {

struct Region {
  RegionId id{};
  std::byte* base = nullptr;
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  bool pinned = false;  // page-locked by ferry at registration (host memory)

  // Returns false once the region is retired.
  bool Acquire();
  void Release();
  // Marks the region dead and waits until no transfer uses it, or `deadline`.
  Status Retire(Deadline deadline);
  bool live() const { return (state_.load(std::memory_order_acquire) & kDead) == 0; }

 private:
  static constexpr int64_t kDead = int64_t{1} << 62;
  std::atomic<int64_t> state_{0};  // kDead bit | number of users
};

// Holds a region acquired for the lifetime of a transfer.
class RegionUse {
 public:
  static std::shared_ptr<RegionUse> Make(std::shared_ptr<Region> region);  // null if retired
  ~RegionUse() { region_->Release(); }
  Region& region() const { return *region_; }

 private:
  explicit RegionUse(std::shared_ptr<Region> region) : region_(std::move(region)) {}
  std::shared_ptr<Region> region_;
};

// Checks that [offset, offset + size) lies inside a region of `region_size` bytes.
inline bool InBounds(uint64_t offset, uint64_t size, uint64_t region_size) {
  return offset <= region_size && size <= region_size - offset;
}

}  // namespace ferry::internal
