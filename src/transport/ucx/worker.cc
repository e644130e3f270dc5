#include "transport/ucx/worker.h"

#include <system_error>

#include <poll.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace ferry::internal::ucx {

Status FromUcs(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return Status::Ok();
  Code code = Code::kUnavailable;
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      code = Code::kResourceExhausted;
      break;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      code = Code::kInvalidArgument;
      break;
    // UCX's own timeouts (keepalive, an endpoint that stopped answering) are a failed peer or
    // link, as a reset is: kUnavailable. kDeadlineExceeded is for ferry's deadlines alone.
    case UCS_ERR_CANCELED:
      code = Code::kAborted;
      break;
    case UCS_ERR_UNSUPPORTED:
      code = Code::kUnsupported;
      break;
    default:
      break;
  }
  return Status(code, std::string(what) + ": " + ucs_status_string(status));
}

Result<ucp_ep_h> OpenEndpoint(ucp_worker_h worker, const std::string& address, ucp_err_handler_cb_t on_error,
                              void* arg) {
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(worker, &params, &ep);
  if (st != UCS_OK) return FromUcs(st, "ucp_ep_create");
  return ep;
}

void CloseEndpoint(ucp_ep_h ep) {
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
}

Result<std::unique_ptr<Worker>> Worker::Create(ucp_context_h context, UcxOptions::Progress mode) {
  ucp_worker_params_t params = {};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, under the worker's lock (see worker.h).
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  ucs_status_t st = ucp_worker_create(context, &params, &worker);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
  int efd = -1;
  if (mode != UcxOptions::Progress::kPolling) {
    st = ucp_worker_get_efd(worker, &efd);
    if (st != UCS_OK) {
      ucp_worker_destroy(worker);
      return FromUcs(st, "ucp_worker_get_efd");
    }
  }
  return std::unique_ptr<Worker>(new Worker(worker, efd, mode));
}

Worker::~Worker() {
  Stop(nullptr);
  ucp_worker_destroy(worker_);
}

Status Worker::Start(std::function<void()> tick, std::function<bool()> outstanding) {
  outstanding_ = std::move(outstanding);
  try {
    thread_ = std::thread([this, tick = std::move(tick)] { Loop(tick); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("cannot start a ucx progress thread: ") + e.what());
  }
  pthread_setname_np(thread_.native_handle(), "ferry-ucx");
  return Status::Ok();
}

bool Worker::Submit(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (closed_) return false;
    queue_.push_back(std::move(fn));
    queued_.store(true, std::memory_order_seq_cst);
  }
  // A syscall only when the thread sleeps (or is about to): a spinning thread sees queued_.
  switch (sleeping_.load(std::memory_order_seq_cst)) {
    case Sleep::kAwake:
      break;
    case Sleep::kOnFd:
      ucp_worker_signal(worker_);
      break;
    case Sleep::kStepBack:
      wake_.NotifyOne();
      break;
  }
  return true;
}

void Worker::Stop(std::function<void()> last) {
  bool started = false;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    started = thread_.joinable();  // only by the one Stop() that closes
    // The progress thread runs `last` as it drains; without one, this thread does, below.
    if (started) last_ = std::move(last);
    stop_.store(true, std::memory_order_release);  // under mu_: the stepped-back thread's predicate
  }
  wake_.NotifyAll();
  if (started) {
    ucp_worker_signal(worker_);
    thread_.join();
    return;
  }
  Hold hold(*this);
  if (last) last();
  stopped_ = true;
}

bool Worker::Usable(bool direct) const {
  if (stopped_ || stop_.load(std::memory_order_acquire)) return false;
  return !direct || !queued_.load(std::memory_order_acquire);
}

bool Worker::TryProgress() {
  if (Held()) return false;  // inside a callback of this worker
  if (!ucx_mu_.TryLock()) return false;
  Hold hold(*this, std::adopt_lock);
  if (!Usable(/*direct=*/false)) return false;
  app_progress_at_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                         std::memory_order_relaxed);
  app_progress_.fetch_add(1, std::memory_order_relaxed);
  // One round, as ucx_perftest's loop does: the caller looks at once at what it delivered
  // (another round would cost a syscall per transport before that) and comes back.
  bool any = ucp_worker_progress(worker_) != 0;
  WakeIfOutstanding();
  return any;
}

void Worker::WakeIfOutstanding() {
  Sleep s = sleeping_.load(std::memory_order_seq_cst);
  if (s == Sleep::kAwake || !outstanding_ || !outstanding_()) return;
  if (s == Sleep::kOnFd) {
    ucp_worker_signal(worker_);
    return;
  }
  {
    MutexLock lock(&mu_);
    poke_ = true;
  }
  wake_.NotifyOne();
}

bool Worker::Shared(std::chrono::steady_clock::time_point now) const {
  if (mode_ != UcxOptions::Progress::kShared) return false;
  int64_t at = app_progress_at_.load(std::memory_order_relaxed);
  return at != 0 &&
         now.time_since_epoch().count() - at <
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(kShareWindow).count();
}

void Worker::StepBack() {
  using Clock = std::chrono::steady_clock;
  const auto window = std::chrono::duration_cast<Clock::duration>(kShareWindow);
  // The tick still runs about every 20 ms (the caller's loop does it).
  const auto tick = Clock::now() + std::chrono::milliseconds(20);
  MutexLock lock(&mu_);
  sleeping_.store(Sleep::kStepBack, std::memory_order_seq_cst);
  auto woken = [this]() REQUIRES(mu_) {
    return poke_ || queued_.load(std::memory_order_acquire) ||
           stop_.load(std::memory_order_acquire);
  };
  // Without taking the worker while the application keeps polling: a thread woken to take it
  // needs a core that the polling threads hold, and one preempted while holding it would
  // stall them until it runs again.
  for (;;) {
    auto until = std::min(
        tick, Clock::time_point(Clock::duration(app_progress_at_.load(std::memory_order_relaxed))) +
                  window);
    if (wake_.WaitUntil(&mu_, until, woken)) break;
    auto now = Clock::now();
    if (now >= tick || !Shared(now)) break;
  }
  poke_ = false;
  sleeping_.store(Sleep::kAwake, std::memory_order_relaxed);
}

bool Worker::RunQueued() {
  if (!queued_.load(std::memory_order_acquire)) return false;  // no lock while idle
  std::vector<std::function<void()>> batch;
  {
    MutexLock lock(&mu_);
    batch.swap(queue_);
    queued_.store(false, std::memory_order_relaxed);
  }
  // Still holding the worker: a TryRun that finds the queue empty runs after this batch.
  for (auto& fn : batch) fn();
  return !batch.empty();
}

void Worker::Loop(std::function<void()> tick) {
  using Clock = std::chrono::steady_clock;
  auto next_tick = Clock::now();
  auto idle_since = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    bool busy = false;
    bool outstanding = false;
    auto now = Clock::now();
    {
      Hold hold(*this);
      busy = RunQueued();
      while (ucp_worker_progress(worker_) != 0) busy = true;
      now = Clock::now();
      if (now >= next_tick) {
        if (tick) tick();
        next_tick = now + std::chrono::milliseconds(20);
      }
      outstanding = outstanding_ && outstanding_();
    }
    if (busy) {
      idle_since = now;
      continue;
    }
    // Application threads are progressing the worker (kShared): stay out of their way until
    // work is handed over, operations are outstanding or they stop.
    if (!outstanding && Shared(now)) {
      step_backs_.fetch_add(1, std::memory_order_relaxed);
      StepBack();
      idle_since = Clock::now();
      continue;
    }
    // Idle: poll on for kSpin (the answer to what was just sent often comes in that time),
    // yielding the core between polls, so that a thread woken on this core (the application's,
    // the peer's on a machine with few cores) runs now rather than after this one's time slice.
    // With operations outstanding, poll on for kOutstandingSpin since UCX last made progress:
    // the event fd does not fire when a TCP socket that was full takes data again, so a thread
    // asleep there sent the rest of a batch only at its 1 ms timeouts (worker.h).
    const auto spin = outstanding ? kOutstandingSpin : kSpin;
    if (mode_ == UcxOptions::Progress::kPolling || now - idle_since < spin) {
      sched_yield();
      continue;
    }
    // Idle for a while: sleep on the event fd until UCX or Submit() wakes us, or the next tick.
    sleeping_.store(Sleep::kOnFd, std::memory_order_seq_cst);
    bool armed = false;
    {
      Hold hold(*this);
      outstanding = outstanding_ && outstanding_();
      armed = !queued_.load(std::memory_order_seq_cst) && !stop_.load(std::memory_order_acquire) &&
              ucp_worker_arm(worker_) == UCS_OK;
    }
    if (armed) {
      // Outside the lock: application threads may progress the worker meanwhile (the fd
      // then wakes this thread for nothing, and it arms again).
      pollfd pfd{efd_, POLLIN, 0};
      poll(&pfd, 1, outstanding ? 1 : 20);
    }
    sleeping_.store(Sleep::kAwake, std::memory_order_relaxed);
    idle_since = Clock::now();
  }
  // Drain: run what was submitted before Stop(), then the last callback, progressing UCX so
  // that the closing of endpoints can complete.
  Hold hold(*this);
  RunQueued();
  std::function<void()> last;
  {
    MutexLock lock(&mu_);
    last = std::move(last_);
  }
  if (last) last();
  RunQueued();
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) {
  }
  stopped_ = true;
}

}  // namespace ferry::internal::ucx
