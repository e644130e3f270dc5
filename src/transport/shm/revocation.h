// The revocation table: a small memory file of 8-byte words that a target engine shares,
// read-only, with every peer that maps one of its regions. A region's word holds the region's
// generation while it is registered and 0 from the moment its deregistration begins, so a peer
// checks before every transfer, with one load from shared memory, that the region is still
// registered, even when it has not read the revocation message yet (e.g. it was stopped and
// just resumed). Generations are never reused, so a slot may serve a new region at once.
//
// Invariants (the words are read lock-free, by other processes):
//  - only the target writes a word, under its mutex: a fresh generation when the slot is
//    published, 0 when it is revoked; a slot is on the free list exactly while its word is 0.
//  - generations only grow, so a (slot, generation) pair that a peer reads back equal names
//    the region it mapped; a revoked or reused slot never matches it again.
//  - stores are release, loads acquire; peers map the file read-only.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "ferry/status.h"

namespace ferry::internal::shm {

inline constexpr uint32_t kRevocationSlots = 8192;
inline constexpr uint32_t kNoSlot = UINT32_MAX;  // a region checked by messages alone

// The target's side: owns the file, writes the words.
class RevocationTable {
 public:
  static Result<std::unique_ptr<RevocationTable>> Create();
  ~RevocationTable();
  int fd() const { return fd_; }
  // A slot and a fresh generation for a region being registered; kNoSlot when all are taken.
  std::pair<uint32_t, uint64_t> Publish() EXCLUDES(mu_);
  // The region of `slot` is being deregistered: peers see it at their next transfer.
  void Revoke(uint32_t slot) EXCLUDES(mu_);

 private:
  RevocationTable() = default;
  int fd_ = -1;
  uint64_t* words_ = nullptr;
  Mutex mu_;
  std::vector<uint32_t> free_ GUARDED_BY(mu_);
  uint64_t next_generation_ GUARDED_BY(mu_) = 1;
};

// A peer's read-only view of a target's table.
class RevocationView {
 public:
  // Maps `fd` (not taken) after checking its seals and size.
  static Result<std::shared_ptr<RevocationView>> Map(int fd);
  ~RevocationView();
  bool Live(uint32_t slot, uint64_t generation) const {
    if (slot >= kRevocationSlots) return true;  // kNoSlot: messages alone revoke it
    return __atomic_load_n(words_ + slot, __ATOMIC_ACQUIRE) == generation;
  }

 private:
  RevocationView() = default;
  const uint64_t* words_ = nullptr;
};

}  // namespace ferry::internal::shm
