// Mapping: one peer region's memory file mapped into this process (once per region and
// connection), and the slot through which channels reach it until the peer revokes it.
//
// A transfer copies through a Mapping it holds (shared_ptr) for as long as its copy runs.
// Revocation empties the slot (new transfers fail with kFailedPrecondition); the mapping is
// unmapped when the last transfer holding it lets go, and then, if the peer asked for it, the
// peer is told (kUnmapped).
//
// Thread safety: MappingSlot's methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "base/memory_file.h"
#include "base/mutex.h"
#include "ferry/status.h"
#include "transport/shm/revocation.h"

namespace ferry::internal::shm {

class Mapping {
 public:
  // Maps `size` bytes at `file_offset` of `fd` (not taken: the caller still closes it) after
  // checking that the file is sealed against shrinking and holds the whole range.
  static Result<std::shared_ptr<Mapping>> Map(int fd, uint64_t file_offset, uint64_t size);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::byte* base() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  // Runs once the mapping is gone (after munmap).
  void OnUnmapped(std::function<void()> f) { on_unmapped_ = std::move(f); }

 private:
  Mapping() = default;
  os::SharedMapping mapping_;
  std::function<void()> on_unmapped_;
};

struct MappingSlot {
  MappingSlot(std::shared_ptr<Mapping> m, uint64_t address, uint64_t size,
              std::shared_ptr<const RevocationView> view = nullptr, uint32_t slot = kNoSlot,
              uint64_t generation = 0)
      : address(address), size(size), mapping_(std::move(m)), view_(std::move(view)), slot_(slot),
        generation_(generation) {}
  const uint64_t address;  // of the region in the peer's address space, as the peer confirmed
  const uint64_t size;

  // The mapping for one more transfer; null once revoked, by message or in the peer's
  // revocation table.
  std::shared_ptr<Mapping> Acquire() EXCLUDES(mu_) {
    if (view_ && !view_->Live(slot_, generation_)) return nullptr;
    MutexLock lock(&mu_);
    return mapping_;
  }
  bool live() EXCLUDES(mu_) {
    if (view_ && !view_->Live(slot_, generation_)) return false;
    MutexLock lock(&mu_);
    return mapping_ != nullptr;
  }
  // Empties the slot; `on_unmapped` runs once the last transfer using the mapping let go
  // (at once when none does). Returns false (and runs nothing) when already revoked.
  bool Revoke(std::function<void()> on_unmapped) EXCLUDES(mu_) {
    std::shared_ptr<Mapping> m;
    {
      MutexLock lock(&mu_);
      m.swap(mapping_);
    }
    if (!m) return false;
    m->OnUnmapped(std::move(on_unmapped));
    return true;  // `m` goes here unless a transfer still holds it
  }

 private:
  Mutex mu_;
  std::shared_ptr<Mapping> mapping_ GUARDED_BY(mu_);
  const std::shared_ptr<const RevocationView> view_;
  const uint32_t slot_;
  const uint64_t generation_;
};

}  // namespace ferry::internal::shm
