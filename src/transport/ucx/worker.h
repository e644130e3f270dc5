// Worker: one UCX worker, driven by its progress thread and, when they poll, by application
// threads.
//
// The worker's lock: every UCX call on the worker, its endpoints and its requests, and every
// touch of the state its callbacks use (the shard's tables, core.h), is made by the thread
// that holds it. The progress thread holds it while it runs submitted work and progresses the
// worker; an application thread takes it only with a try-lock (TryRun, TryProgress), so it
// never waits behind the progress thread. So the worker runs in UCS_THREAD_MODE_SERIALIZED
// (several threads, one at a time): MULTI would add UCX's own lock to every call under this
// one, which ferry needs anyway for its tables.
//
// Idle, the progress thread keeps polling for kSpin (kOutstandingSpin while operations are
// outstanding), yielding the core between polls, then
// either keeps polling (Progress::kPolling) or sleeps on the worker's event fd (kEvent, and
// kShared when no application thread polls): for at most 1 ms while operations are
// outstanding (UCX does not signal the fd for every local completion), 20 ms otherwise. In
// Progress::kShared mode, while application threads have progressed the worker in the last
// kShareWindow and nothing is outstanding, the thread steps back: it sleeps (not on the event
// fd, so arriving messages do not wake it) until work is submitted or the window passes.
// An application thread that leaves operations in flight wakes a sleeping progress thread.
// Submit() makes a syscall only when the thread sleeps; a spinning thread sees the work
// through an atomic flag. The tick callback runs about every 20 ms on the thread, for
// housekeeping.
//
// Thread safety: Submit(), TryRun(), TryProgress(), Held() from any thread; handle() and
// everything done with it by the thread that holds the worker (Held()). Locks: the worker's
// (ucx_mu_) is taken before the queue's (mu_), never the other way round.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "ferry/options.h"
#include "ferry/status.h"

namespace ferry::internal::ucx {

class Worker {
 public:
  // How long an idle thread polls before it sleeps (Progress::kEvent). Polling without
  // yielding made every notification on this 2-core machine wait for the spinning thread's
  // time slice (one-way latency = the spin); yielding, 20 us to 1 ms all gave 16-18 us
  // (bench/results/ucx_two_process.md).
  static constexpr std::chrono::microseconds kSpin{100};
  // How long the thread polls on (yielding) while operations are outstanding and UCX makes no
  // progress, before it sleeps on the event fd (for 1 ms at a time). The fd does not fire when
  // a TCP socket that was full can take data again (nor for every local completion): a sender
  // asleep there with a batch half sent waited out the 1 ms timeout each time its socket
  // filled, and over TCP loopback on 2 cores the rounds split into a fast mode and one at half
  // the speed (bench/results/ucx_two_process.md, 2026-12-03). A socket that filled takes data
  // again well within this; a peer that stopped answering costs the core this long, then the
  // thread sleeps as before.
  static constexpr std::chrono::microseconds kOutstandingSpin{2000};
  // Progress::kShared: how long after an application thread's TryProgress the progress
  // thread stays back. Also the longest that arriving messages wait for progress when the
  // application stops polling.
  static constexpr std::chrono::microseconds kShareWindow{1000};

  static Result<std::unique_ptr<Worker>> Create(ucp_context_h context, UcxOptions::Progress mode);
  ~Worker();  // stops and joins the progress thread, then destroys the worker

  // REQUIRES: Held(), or the progress thread not started yet.
  ucp_worker_h handle() const { return worker_; }
  // Starts the progress thread (kResourceExhausted when it cannot start). REQUIRES: AM
  // handlers are set. `outstanding` (called holding the worker) says whether operations are in
  // flight.
  Status Start(std::function<void()> tick, std::function<bool()> outstanding);
  // Runs `fn` on the progress thread, holding the worker; returns false once it is stopping.
  bool Submit(std::function<void()> fn) EXCLUDES(mu_);
  // Stops the thread after it ran `last` (holding the worker) and everything submitted before.
  void Stop(std::function<void()> last) EXCLUDES(ucx_mu_, mu_);

  // Whether the calling thread holds the worker: the progress thread in its loop, or an
  // application thread inside TryRun/TryProgress (e.g. in a callback that progress ran).
  bool Held() const { return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }
  // Runs `fn` now on the calling thread, holding the worker, if it can be taken without
  // waiting, the worker runs and nothing submitted is still queued (so `fn` does not overtake
  // work submitted before it). Returns false, without running `fn`, otherwise; then the
  // caller Submit()s it. REQUIRES: !Held().
  template <typename F>
  bool TryRun(F& fn) EXCLUDES(ucx_mu_) {
    if (!ucx_mu_.TryLock()) return false;
    Hold hold(*this, std::adopt_lock);
    if (!Usable(/*direct=*/true)) return false;
    fn();
    direct_runs_.fetch_add(1, std::memory_order_relaxed);
    WakeIfOutstanding();
    return true;
  }
  // Progresses the worker from the calling thread if it can be taken without waiting (and
  // the calling thread does not already hold it: UCX forbids progress from its callbacks).
  // Returns whether UCX made progress.
  bool TryProgress() EXCLUDES(ucx_mu_);

  // For tests and diagnostics.
  bool asleep() const { return sleeping_.load(std::memory_order_acquire) != Sleep::kAwake; }
  uint64_t direct_runs() const { return direct_runs_.load(std::memory_order_relaxed); }
  uint64_t app_progress() const { return app_progress_.load(std::memory_order_relaxed); }
  uint64_t step_backs() const { return step_backs_.load(std::memory_order_relaxed); }

 private:
  enum class Sleep : uint8_t { kAwake, kOnFd, kStepBack };
  // Holds the worker for its scope: its lock, and owner_ set to the holding thread. The
  // adopting form takes over the lock that the caller took with ucx_mu_.TryLock() (application
  // threads never wait for the worker).
  class SCOPED_CAPABILITY Hold {
   public:
    explicit Hold(Worker& w) ACQUIRE(w.ucx_mu_) : w_(w) {
      w_.ucx_mu_.Lock();
      Own();
    }
    Hold(Worker& w, std::adopt_lock_t) REQUIRES(w.ucx_mu_) : w_(w) { Own(); }
    ~Hold() RELEASE() {
      w_.owner_.store(std::thread::id(), std::memory_order_relaxed);
      w_.ucx_mu_.Unlock();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    void Own() { w_.owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
    Worker& w_;
  };

  Worker(ucp_worker_h worker, int efd, UcxOptions::Progress mode)
      : worker_(worker), efd_(efd), mode_(mode) {}
  void Loop(std::function<void()> tick) EXCLUDES(ucx_mu_, mu_);
  bool RunQueued() REQUIRES(ucx_mu_) EXCLUDES(mu_);
  // Whether an application thread holding the worker may use it: not drained, not stopping
  // and, for work of its own (`direct`), nothing submitted still waiting to run.
  bool Usable(bool direct) const REQUIRES(ucx_mu_);
  void StepBack() EXCLUDES(mu_);
  // After an application thread used the worker: a sleeping progress thread must come back
  // for operations it left in flight.
  void WakeIfOutstanding() REQUIRES(ucx_mu_) EXCLUDES(mu_);
  // kShared: whether application threads progressed the worker within kShareWindow.
  bool Shared(std::chrono::steady_clock::time_point now) const;

  ucp_worker_h worker_;
  int efd_;  // the worker's event fd (kEvent and kShared), -1 otherwise
  const UcxOptions::Progress mode_;
  std::thread thread_;
  std::function<bool()> outstanding_;  // set before the thread starts

  Mutex ucx_mu_;  // the worker's lock (see the header comment)
  std::atomic<std::thread::id> owner_{};
  bool stopped_ GUARDED_BY(ucx_mu_) = false;  // the worker is drained; nobody progresses it

  std::atomic<bool> stop_{false};
  std::atomic<Sleep> sleeping_{Sleep::kAwake};
  std::atomic<bool> queued_{false};          // queue_ is not empty; set under mu_
  std::atomic<int64_t> app_progress_at_{0};  // steady_clock ns of the last TryProgress
  std::atomic<uint64_t> direct_runs_{0};
  std::atomic<uint64_t> app_progress_{0};
  std::atomic<uint64_t> step_backs_{0};
  Mutex mu_ ACQUIRED_AFTER(ucx_mu_);
  CondVar wake_;                                              // the stepped-back thread waits here, on mu_
  bool poke_ GUARDED_BY(mu_) = false;                         // wake_ was signalled
  std::vector<std::function<void()>> queue_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  std::function<void()> last_ GUARDED_BY(mu_);
};

// Opens an endpoint of `worker` to the worker at `address` (a checked, padded worker address:
// Core::CheckedWorkerAddress), with peer-failure handling reported to `on_error(arg, ...)`.
// REQUIRES: the worker is held.
Result<ucp_ep_h> OpenEndpoint(ucp_worker_h worker, const std::string& address, ucp_err_handler_cb_t on_error,
                              void* arg);

// Closes `ep` at once (in-flight operations on it fail). REQUIRES: its worker is held.
void CloseEndpoint(ucp_ep_h ep);

// A UCX status as a ferry Status: transport failures map to kUnavailable.
Status FromUcs(ucs_status_t status, std::string_view what);

}  // namespace ferry::internal::ucx
