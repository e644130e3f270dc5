// WaitAll and WaitAny: one waiter over many transfers. Each transfer gets an observer
// (TransferState::OnFinish) that wakes the waiter's condition variable; the waiter sleeps until
// then or until the earliest deadline among the transfers still running (when it finishes the
// expired ones with Test()), and removes its observers before it returns. Transfers that
// complete only through polling (GPU copies with a poller) are polled without sleeping for the
// longest of their wait_spin (EngineOptions::wait_spin), then on a short, growing back-off, as
// Transfer::Wait does.
#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/poll_pacer.h"
#include "engine/engine_core.h"

namespace ferry {
namespace {

using internal::TransferAccess;
using internal::TransferState;

class Waiter {
 public:
  enum class Mode { kAll, kAny };
  Waiter(std::span<const Transfer> transfers, Mode mode) : mode_(mode) {
    for (const Transfer& t : transfers) states_.push_back(TransferAccess::Of(t));
  }

  // OK / first error (kAll) or the index (kAny); kInProgress when `until` passed first.
  Result<size_t> Run(std::optional<Deadline> until) {
    auto shared = std::make_shared<Shared>(states_.size());
    std::vector<uint64_t> handles(states_.size(), 0);
    for (size_t i = 0; i < states_.size(); ++i) {
      if (!states_[i]) {
        shared->Arrived(i, Status(Code::kFailedPrecondition, "empty transfer handle"));
        continue;
      }
      handles[i] = states_[i]->OnFinish([shared, i](const Status& s) { shared->Arrived(i, s); });
    }
    Result<size_t> out = Wait(*shared, until);
    for (size_t i = 0; i < states_.size(); ++i)
      if (handles[i] != 0) (void)states_[i]->RemoveOnFinish(handles[i]);
    return out;
  }

 private:
  struct Shared {
    explicit Shared(size_t transfers) : pending(transfers) {}
    Mutex mu;
    CondVar cv;
    size_t pending GUARDED_BY(mu) = 0;
    std::optional<size_t> first GUARDED_BY(mu);  // lowest index finished
    Status error GUARDED_BY(mu);                 // first error, in finishing order
    void Arrived(size_t i, const Status& s) EXCLUDES(mu) {
      {
        MutexLock lock(&mu);
        --pending;
        if (!first || i < *first) first = i;
        if (!s.ok() && error.ok()) error = s;
      }
      cv.NotifyAll();
    }
  };

  Result<size_t> Wait(Shared& sh, std::optional<Deadline> until) {
    Duration spin = Duration::zero();
    for (const auto& s : states_)
      if (s && s->has_poller()) spin = std::max(spin, s->wait_spin());
    PollPacer pacer(Clock::now(), spin);
    while (true) {
      // The earliest deadline among those running, and whether any needs polling.
      Clock::time_point earliest = Clock::time_point::max();
      std::optional<size_t> earliest_index;
      bool poll = false;
      for (size_t i = 0; i < states_.size(); ++i) {
        const auto& s = states_[i];
        if (!s || s->finished()) continue;
        if (s->has_poller()) {
          poll = true;
          (void)s->Test();  // may finish it (its observer records that)
        }
        if (s->deadline().at() < earliest) {
          earliest = s->deadline().at();
          earliest_index = i;
        }
      }
      {
        MutexLock lock(&sh.mu);
        if (mode_ == Mode::kAll && (!sh.error.ok() || sh.pending == 0)) return ErrorOr(sh.error);
        if (mode_ == Mode::kAny && sh.first) return *sh.first;
        Clock::time_point wake = earliest;
        if (until) wake = std::min(wake, until->at());
        if (poll) wake = std::min(wake, pacer.Next(Clock::now()));
        if (Clock::now() < wake) {
          auto done = [&]() REQUIRES(sh.mu) {
            return mode_ == Mode::kAll ? (!sh.error.ok() || sh.pending == 0) : sh.first.has_value();
          };
          if (sh.cv.WaitUntil(&sh.mu, wake, done)) continue;
        }
      }
      if (poll && pacer.Spinning(Clock::now())) std::this_thread::yield();
      if (earliest_index && Clock::now() >= earliest) {
        // The earliest deadline passed: that transfer fails now (Test() finishes it).
        if (mode_ == Mode::kAny) {
          {
            MutexLock lock(&sh.mu);
            if (sh.first) return *sh.first;  // one finished in time after all
          }
          (void)states_[*earliest_index]->Test();
          return Status(Code::kDeadlineExceeded,
                        "transfer " + std::to_string(*earliest_index) + " of the list passed its deadline");
        }
        (void)states_[*earliest_index]->Test();
        continue;  // kAll: its error is recorded by its observer
      }
      if (until && until->expired()) return Status(Code::kInProgress, "transfers still running");
    }
  }

  static Result<size_t> ErrorOr(const Status& s) {
    if (!s.ok()) return s;
    return size_t{0};  // WaitAll reads only the status
  }

  const Mode mode_;
  std::vector<std::shared_ptr<TransferState>> states_;
};

}  // namespace

Status WaitAll(std::span<const Transfer> transfers) {
  Result<size_t> r = Waiter(transfers, Waiter::Mode::kAll).Run(std::nullopt);
  return r.ok() ? Status::Ok() : r.status();
}

Status WaitAll(std::span<const Transfer> transfers, Duration timeout) {
  Result<size_t> r = Waiter(transfers, Waiter::Mode::kAll).Run(Deadline::After(timeout));
  return r.ok() ? Status::Ok() : r.status();
}

Result<size_t> WaitAny(std::span<const Transfer> transfers) {
  if (transfers.empty()) return Status(Code::kInvalidArgument, "WaitAny over no transfers");
  return Waiter(transfers, Waiter::Mode::kAny).Run(std::nullopt);
}

Result<size_t> WaitAny(std::span<const Transfer> transfers, Duration timeout) {
  if (transfers.empty()) return Status(Code::kInvalidArgument, "WaitAny over no transfers");
  return Waiter(transfers, Waiter::Mode::kAny).Run(Deadline::After(timeout));
}

}  // namespace ferry
