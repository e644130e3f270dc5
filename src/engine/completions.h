// Completions: an engine's completion thread, which runs the transfers' completion callbacks
// (TransferOptions::on_complete) and finishes watched transfers at their deadlines, so that a
// transfer nobody waits on still completes, and its callback runs, by its deadline.
//
// Callbacks run one at a time on this one thread, never on a transport's thread and never with
// a lock of the engine or of a transport held: a callback may post transfers, notify, or
// destroy the engine. One that blocks delays the callbacks after it (and deadlines), nothing
// else. Once the engine stops (Stop), callbacks of transfers that finish later run on the
// thread that finishes them.
//
// The deadlines watched are a heap of weak references; finished entries are pruned when the
// heap doubles, so it holds at most about twice the transfers that are watched and running.
//
// Thread safety: every method may be called from any thread, Stop() included (also from a
// callback, i.e. from the completion thread itself).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "ferry/status.h"
#include "transport/transfer_state.h"

namespace ferry::internal {

class Completions : public std::enable_shared_from_this<Completions> {
 public:
  using Callback = std::function<void(const Status&)>;

  // Starts the thread; kResourceExhausted when it cannot start.
  static Result<std::shared_ptr<Completions>> Create();
  ~Completions();

  // Runs `fn` exactly once with `state`'s final status: at once on this thread if `state` has
  // finished, else on the completion thread when it finishes (or by its deadline).
  void Attach(const std::shared_ptr<TransferState>& state, Callback fn);
  // Finishes `state` (kDeadlineExceeded) at its deadline if it is still running then.
  void Watch(const std::shared_ptr<TransferState>& state);
  // Runs the callbacks queued, then ends the thread.
  void Stop();

  // Callbacks run and transfers watched so far (for tests).
  uint64_t callbacks_run() const;

 private:
  struct Entry {
    Clock::time_point at;
    std::weak_ptr<TransferState> state;
    bool operator>(const Entry& o) const { return at > o.at; }
  };
  Completions() = default;
  void Run() EXCLUDES(mu_);
  // Queues `fn` for the thread; runs it here once stopped.
  void Dispatch(Callback fn, const Status& status);

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::pair<Callback, Status>> ready_ GUARDED_BY(mu_);
  std::vector<Entry> deadlines_ GUARDED_BY(mu_);  // a min-heap on `at`
  size_t prune_at_ GUARDED_BY(mu_) = 1024;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t callbacks_run_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace ferry::internal
