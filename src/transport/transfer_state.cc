#include "transport/transfer_state.h"

#include <string>
#include <thread>

#include "base/poll_pacer.h"

namespace ferry::internal {

TransferState::TransferState(TransferId id, uint64_t bytes, TransferPath path, Deadline deadline)
    : id_(id), bytes_(bytes), path_(std::move(path)), deadline_(deadline) {}

TransferState::~TransferState() {
  if (!on_finish_.empty()) {
    const Status dropped(Code::kAborted, "transfer " + std::to_string(static_cast<uint64_t>(id_)) +
                                             " was dropped before it finished");
    for (auto& o : on_finish_) o.fn(dropped);
  }
}

uint64_t TransferState::OnFinish(std::function<void(const Status&)> fn) {
  {
    MutexLock lock(&mu_);
    if (phase_.load(std::memory_order_relaxed) == kRunning) {
      const uint64_t handle = next_observer_++;
      on_finish_.push_back(Observer{handle, std::move(fn)});
      return handle;
    }
  }
  fn(status());
  return 0;
}

bool TransferState::RemoveOnFinish(uint64_t handle) {
  std::function<void(const Status&)> gone;  // destroyed after the lock is released
  MutexLock lock(&mu_);
  for (auto it = on_finish_.begin(); it != on_finish_.end(); ++it) {
    if (it->handle != handle) continue;
    gone = std::move(it->fn);
    on_finish_.erase(it);
    return true;
  }
  return false;
}

std::shared_ptr<TransferState> TransferState::Failed(Status status, TransferId id,
                                                     TransferPath path) {
  auto state = std::make_shared<TransferState>(id, 0, std::move(path), Deadline());
  state->Finish(std::move(status));
  state->PartDone(Status::Ok());
  return state;
}

std::shared_ptr<TransferState> TransferState::Succeeded(TransferId id, TransferPath path) {
  auto state = std::make_shared<TransferState>(id, 0, std::move(path), Deadline());
  state->PartDone(Status::Ok());
  return state;
}

void TransferState::PartDone(const Status& status) {
  if (!status.ok()) Finish(status);
  if (parts_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (continuation_ && !finished() && !deadline_.expired()) {
      // Every part succeeded in time: run the next step, which adds parts of its own.
      auto next = std::move(continuation_);
      continuation_ = nullptr;
      parts_.fetch_add(1, std::memory_order_acq_rel);
      next(shared_from_this());
      return PartDone(Status::Ok());
    }
    // A transfer whose last part lands after its deadline failed it, whether or not a waiter
    // noticed in time (no-op when an error or the deadline finished it first).
    Finish(deadline_.expired() ? DeadlineStatus() : Status::Ok());
    // Every part is done: nothing touches the regions any more.
    std::vector<std::shared_ptr<void>> holds;
    {
      MutexLock lock(&mu_);
      holds.swap(holds_);
    }
  }
}

bool TransferState::Finish(Status status) {
  std::vector<Observer> observers;
  {
    MutexLock lock(&mu_);
    if (phase_.load(std::memory_order_relaxed) != kRunning) return false;
    status_ = std::move(status);
    phase_.store(kFinished, std::memory_order_release);
    observers.swap(on_finish_);
  }
  cv_.NotifyAll();
  for (auto& o : observers) o.fn(FinalStatus());
  return true;
}

Status TransferState::DeadlineStatus() const {
  return Status(Code::kDeadlineExceeded,
                "transfer " + std::to_string(static_cast<uint64_t>(id_)) + " passed its deadline");
}

void TransferState::CheckDeadline() {
  if (phase_.load(std::memory_order_acquire) == kRunning && deadline_.expired()) Finish(DeadlineStatus());
}

bool TransferState::Test() {
  if (finished()) return true;
  if (poller_) poller_();
  CheckDeadline();
  return finished();
}

Status TransferState::Wait(Deadline until) {
  until = Deadline::Earlier(until, deadline_);
  if (poller_) {
    // Completion arrives through polling (or the copy engine's completion thread, which
    // finishes the transfer as soon as its event fires): poll without sleeping (yielding) for
    // wait_spin_, then wait on the condition variable between polls (PollPacer). Finish() wakes
    // the waiter at once; a plain sleep would add the kernel's timer slack (50 us by default) to
    // every poll. The completion thread's own wake-up from its blocking event wait took 30-55 us
    // on an H200 machine's host (bench/results/cuda_ipc.md): a copy that ends within the spin
    // is seen within a few microseconds instead.
    PollPacer pacer(Clock::now(), wait_spin_);
    while (!Test()) {
      if (until.expired()) break;
      const Clock::time_point now = Clock::now();
      if (pacer.Spinning(now)) {
        std::this_thread::yield();
        continue;
      }
      MutexLock lock(&mu_);
      (void)cv_.WaitUntil(&mu_, std::min(until.at(), pacer.Next(now)),
                          [this] { return phase_.load(std::memory_order_acquire) == kFinished; });
    }
  } else {
    MutexLock lock(&mu_);
    (void)cv_.WaitUntil(&mu_, until.at(), [this] { return phase_.load(std::memory_order_acquire) == kFinished; });
  }
  CheckDeadline();
  if (!finished()) return Status(Code::kInProgress, "transfer still running");
  return status();
}

Status TransferState::status() const {
  if (!finished()) return Status(Code::kInProgress, "transfer still running");
  MutexLock lock(&mu_);
  return status_;
}

}  // namespace ferry::internal
