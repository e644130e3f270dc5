// Worker: one UCX worker driven by one progress thread.
//
// Every UCX call on the worker, its endpoints and its requests is made on the progress thread
// (the worker runs in UCS_THREAD_MODE_SINGLE); other threads hand work over with Submit().
// Idle, the thread keeps polling for kSpin, yielding the core between polls, then either
// keeps polling (Progress::kPolling) or sleeps on the worker's event fd (Progress::kEvent):
// for at most 1 ms while operations are outstanding (UCX does not signal the fd for every
// local completion), 20 ms otherwise. Submit() makes a syscall (ucp_worker_signal) only when
// the thread sleeps; a spinning thread sees the work through an atomic flag. The tick
// callback runs about every 20 ms on the thread, for housekeeping.
//
// Thread safety: Submit() from any thread; everything else on the progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry::internal::ucx {

class Worker {
 public:
  // How long an idle thread polls before it sleeps (Progress::kEvent). Polling without
  // yielding made every notification on this 2-core machine wait for the spinning thread's
  // time slice (one-way latency = the spin); yielding, 20 us to 1 ms all gave 16-18 us
  // (bench/results/ucx_two_process.md).
  static constexpr std::chrono::microseconds kSpin{100};

  static Result<std::unique_ptr<Worker>> Create(ucp_context_h context, UcxOptions::Progress mode);
  ~Worker();  // stops and joins the progress thread, then destroys the worker

  ucp_worker_h handle() const { return worker_; }
  // Starts the progress thread. REQUIRES: AM handlers are set.
  // `outstanding` says whether operations are in flight.
  void Start(std::function<void()> tick, std::function<bool()> outstanding);
  // Runs `fn` on the progress thread; returns false once the worker is stopping.
  bool Submit(std::function<void()> fn);
  // Stops the thread after it ran `last` (on the thread) and everything submitted before.
  void Stop(std::function<void()> last);
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  Worker(ucp_worker_h worker, int efd, UcxOptions::Progress mode)
      : worker_(worker), efd_(efd), mode_(mode) {}
  void Loop(std::function<void()> tick, std::function<bool()> outstanding);
  bool RunQueued();

  ucp_worker_h worker_;
  int efd_;  // the worker's event fd (kEvent mode), -1 otherwise
  const UcxOptions::Progress mode_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> queued_{false};  // queue_ is not empty; set under mu_
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  bool closed_ = false;                       // GUARDED_BY(mu_)
  std::function<void()> last_;                // GUARDED_BY(mu_)
};

// Closes `ep` at once (in-flight operations on it fail). Progress thread only.
void CloseEndpoint(ucp_ep_h ep);

// A UCX status as a ferry Status: transport failures map to kUnavailable.
Status FromUcs(ucs_status_t status, std::string_view what);

}  // namespace ferry::internal::ucx
