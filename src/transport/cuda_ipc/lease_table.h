// LeaseTable: how the owner of GPU regions exported through CUDA IPC learns that no peer
// process still writes into a region it is deregistering.
//
// The owner creates a small shared-memory table (one per engine) and publishes each registered
// region in a slot, as its region id. A peer claims a row of the table for its process and,
// for every batch, takes a lease on the slot before enqueueing copies and returns it when the
// copies are complete on the GPU. Deregistration clears the slot, then waits until no live
// peer process holds a lease on it: after Revoke() returns OK, no peer can start a copy into
// the region (its next lease fails) and none is still running. Rows of peer processes that
// died are ignored (a dead process's CUDA context, and its copies, are gone).
//
// Invariants (all atomics sequentially consistent, across processes):
//  - a peer increments users[row][slot] and then reads slot id; the owner writes the slot id
//    and then reads users: at least one sees the other, so a lease that succeeded is counted.
//  - region ids are never reused, so a slot reused for a new region fails stale leases.
//  - a slot whose drain timed out is never reused by this table.
//
// Thread safety: every method may be called from any thread; the table's memory is shared
// with other processes, which are trusted only to the extent of the same user.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/status.h"

namespace ferry::internal::cuda_ipc {

class LeaseTable {
 public:
  static constexpr uint32_t kSlots = 1024;  // regions one engine exports at once
  static constexpr uint32_t kRows = 32;     // peer processes at once

  // The owner's table, under a fresh name; the name is unlinked when the table is destroyed.
  static Result<std::shared_ptr<LeaseTable>> Create();
  // A peer's view of the table named `name`: kUnavailable when it does not exist (any more),
  // kInvalidArgument when it is not a lease table of this version.
  static Result<std::shared_ptr<LeaseTable>> Open(const std::string& name);
  ~LeaseTable();

  const std::string& name() const { return name_; }
  // Whether the process that created the table still runs.
  bool OwnerAlive() const;
  // A peer's view: removes the table's name once its owner died (a killed owner cannot).
  void UnlinkIfOwnerDead() EXCLUDES(mu_);

  // Owner: publishes `region` (never 0) in a free slot; kResourceExhausted when none is left.
  Result<uint32_t> Publish(uint64_t region) EXCLUDES(mu_);
  // Owner: withdraws the slot, then waits until no live peer holds a lease on it, or
  // `deadline` (kDeadlineExceeded; the slot is then never reused).
  Status Revoke(uint32_t slot, Deadline deadline) EXCLUDES(mu_);

  // Peer: a row for this process (kResourceExhausted when every row is taken by a live one).
  Result<uint32_t> ClaimRow();
  void ReleaseRow(uint32_t row);
  // Peer: takes a lease on `slot` if it still holds `region`.
  bool Acquire(uint32_t row, uint32_t slot, uint64_t region);
  void Release(uint32_t row, uint32_t slot);
  // Whether `slot` still holds `region` (no lease taken).
  bool Live(uint32_t slot, uint64_t region) const;

 private:
  struct Layout;
  LeaseTable(std::string name, Layout* layout, bool owner) : name_(std::move(name)), layout_(layout), owner_(owner) {}

  const std::string name_;
  Layout* const layout_;  // mapped shared memory
  const bool owner_;
  Mutex mu_;
  std::vector<uint8_t> retired_ GUARDED_BY(mu_);  // owner only: slots never to be reused
  bool unlinked_ GUARDED_BY(mu_) = false;
};

}  // namespace ferry::internal::cuda_ipc
