// Region: a registered local memory region as the engine and the transports see it.
//
// A transfer acquires every region it touches for as long as any part of it runs; deregistering
// a region marks it dead (new transfers fail) and then waits for the transfers still using it.
//
// A region may carry an access list (RegionOptions::allowed_peers): the transports that reach
// it from other engines ask Admit() with the requesting peer's engine key before any byte
// moves, and a refusal is counted and logged by the owning engine's AccessDenials.
//
// Thread safety: Acquire/Release/Retire/Admit may be called from any thread; the access list
// is fixed before the region is handed to the transports.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/descriptors.h"
#include "ferry/status.h"

namespace ferry::internal {

// Refusals of regions' access lists, for one engine (EngineStats::access_denied and the
// Prometheus counter ferry_access_denied_total). Each (peer, region) pair is logged once (the
// first kMaxLogged pairs: a peer cycling through keys must not grow memory or flood the log).
class AccessDenials {
 public:
  static constexpr size_t kMaxLogged = 1024;
  void Deny(std::string_view transport, std::string_view peer, RegionId region) EXCLUDES(mu_);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> count_{0};
  Mutex mu_;
  std::set<std::pair<std::string, uint64_t>> logged_ GUARDED_BY(mu_);
};

struct Region {
  RegionId id{};
  std::byte* base = nullptr;
  uint64_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  bool pinned = false;  // page-locked by ferry at registration (host memory)
  // Engine keys that may reach the region from other engines, sorted; empty = every peer.
  // The owning engine's key is on every non-empty list (it always reaches its own memory).
  std::vector<std::string> allowed_peers;
  // The owning engine's counter of refusals; null where a test makes a region on its own.
  std::shared_ptr<AccessDenials> denials;

  bool restricted() const { return !allowed_peers.empty(); }
  // Whether engine `peer` may reach the region (no counting).
  bool Allows(std::string_view peer) const;
  // Allows(peer); a refusal is counted and logged (once per peer) through `denials`, naming
  // `transport`. Call it once per refused request, before any byte moves.
  bool Admit(std::string_view transport, std::string_view peer) const;

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
