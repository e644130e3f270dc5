// TransferState: the shared completion record behind a public Transfer handle.
//
// A transport announces the parts it will complete (AddParts) and completes each with
// PartDone(status); the transfer finishes when every part is done, or earlier with an error
// when a part fails or the deadline passes. A continuation (e.g. sending the notification of a
// write batch) runs once when every part succeeded, and may add parts of its own. Transports that complete by polling (CUDA events)
// install a poller that Test()/Wait() drive.
//
// Invariants:
//  - phase_ goes kRunning -> kFinished exactly once; the thread that wins the exchange
//    publishes the status.
//  - the continuation runs at most once, on the thread that completed the last part, and only
//    while the transfer is still running.
//  - holds_ (regions pinned by the transfer) are released when the last part is done, never
//    at the deadline: a late copy still owns the memory it touches.
//
// Thread safety: every method may be called from any thread. mu_ guards the observers, the
// holds and the final status; phase_ and parts_ are atomics read without it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/descriptors.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class TransferState : public std::enable_shared_from_this<TransferState> {
 public:
  TransferState(TransferId id, uint64_t bytes, TransferPath path, Deadline deadline);
  ~TransferState();

  static std::shared_ptr<TransferState> Failed(Status status, TransferId id = {},
                                               TransferPath path = {});
  static std::shared_ptr<TransferState> Succeeded(TransferId id, TransferPath path);

  // Announces `n` more parts. REQUIRES: called before the parts can complete.
  void AddParts(int n) { parts_.fetch_add(n, std::memory_order_relaxed); }
  // Completes one part. The first error finishes the transfer with it.
  void PartDone(const Status& status) EXCLUDES(mu_);
  // Finishes now (first call wins); returns whether this call finished it.
  bool Finish(Status status) EXCLUDES(mu_);

  // Runs when every part succeeded, before the transfer finishes; it adds and completes parts
  // of its own (AddParts/PartDone). Set before posting.
  void SetContinuation(std::function<void(const std::shared_ptr<TransferState>&)> next) {
    continuation_ = std::move(next);
  }
  // Runs `fn` with the final status once the transfer finishes (at once, on this thread, if it
  // has), on the thread that finishes it, with no lock held. A transfer destroyed unfinished
  // runs it with kAborted. Returns a handle for RemoveOnFinish, 0 when `fn` already ran.
  uint64_t OnFinish(std::function<void(const Status&)> fn) EXCLUDES(mu_);
  // Forgets an observer that has not run (e.g. a waiter that gave up); false if it ran or is
  // running.
  bool RemoveOnFinish(uint64_t handle) EXCLUDES(mu_);
  // Called by Test/Wait to drive completion. Set before posting.
  void SetPoller(std::function<void()> poller) { poller_ = std::move(poller); }
  // How long a waiter polls a transfer with a poller without sleeping (EngineOptions::wait_spin).
  // Set before posting.
  void SetWaitSpin(Duration spin) { wait_spin_ = spin; }
  Duration wait_spin() const { return wait_spin_; }
  // Keeps `hold` alive until every part is done.
  void Hold(std::shared_ptr<void> hold) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    holds_.push_back(std::move(hold));
  }

  // Whether completion arrives only through polling (SetPoller): a waiter must call Test().
  bool has_poller() const { return static_cast<bool>(poller_); }

  bool Test() EXCLUDES(mu_);
  Status Wait(Deadline until) EXCLUDES(mu_);
  Status status() const EXCLUDES(mu_);
  bool finished() const { return phase_.load(std::memory_order_acquire) == kFinished; }

  TransferId id() const { return id_; }
  uint64_t bytes() const { return bytes_; }
  const TransferPath& path() const { return path_; }
  Deadline deadline() const { return deadline_; }

 private:
  enum Phase : int { kRunning = 0, kFinished = 2 };
  void CheckDeadline() EXCLUDES(mu_);
  Status DeadlineStatus() const;
  // status_ once finished. It is written once, under mu_, before phase_ turns kFinished
  // (release), and never again: a thread that saw kFinished reads it without the lock, which
  // the analysis cannot follow. REQUIRES: finished().
  const Status& FinalStatus() const NO_THREAD_SAFETY_ANALYSIS { return status_; }

  const TransferId id_;
  const uint64_t bytes_;
  const TransferPath path_;
  const Deadline deadline_;
  // Set before posting, then read (and the continuation taken) only by the thread that
  // completes the last part: no lock.
  std::function<void(const std::shared_ptr<TransferState>&)> continuation_;
  std::function<void()> poller_;
  Duration wait_spin_ = std::chrono::microseconds(100);
  struct Observer {
    uint64_t handle;
    std::function<void(const Status&)> fn;
  };
  std::atomic<int> phase_{kRunning};  // written under mu_; read without it
  std::atomic<int64_t> parts_{1};  // one extra part held by the poster until posting is done
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Observer> on_finish_ GUARDED_BY(mu_);
  uint64_t next_observer_ GUARDED_BY(mu_) = 1;
  std::vector<std::shared_ptr<void>> holds_ GUARDED_BY(mu_);  // released when parts_ reaches zero
  Status status_ GUARDED_BY(mu_);  // valid once phase_ == kFinished
};

}  // namespace ferry::internal
