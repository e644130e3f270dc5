#include "transport/ucx/worker.h"

#include <poll.h>
#include <sched.h>
#include <pthread.h>

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
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      code = Code::kDeadlineExceeded;
      break;
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
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  ucs_status_t st = ucp_worker_create(context, &params, &worker);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
  int efd = -1;
  if (mode == UcxOptions::Progress::kEvent) {
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

void Worker::Start(std::function<void()> tick, std::function<bool()> outstanding) {
  thread_ = std::thread([this, tick = std::move(tick), outstanding = std::move(outstanding)] {
    Loop(tick, outstanding);
  });
  pthread_setname_np(thread_.native_handle(), "ferry-ucx");
}

bool Worker::Submit(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    queue_.push_back(std::move(fn));
    queued_.store(true, std::memory_order_seq_cst);
  }
  // A syscall only when the thread sleeps (or is about to): a spinning thread sees queued_.
  if (sleeping_.load(std::memory_order_seq_cst)) ucp_worker_signal(worker_);
  return true;
}

void Worker::Stop(std::function<void()> last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    last_ = std::move(last);
  }
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) {
    ucp_worker_signal(worker_);
    thread_.join();
  } else if (last_) {
    last_();
  }
}

bool Worker::RunQueued() {
  if (!queued_.load(std::memory_order_acquire)) return false;  // no lock while idle
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
    queued_.store(false, std::memory_order_relaxed);
  }
  for (auto& fn : batch) fn();
  return !batch.empty();
}

void Worker::Loop(std::function<void()> tick, std::function<bool()> outstanding) {
  using Clock = std::chrono::steady_clock;
  auto next_tick = Clock::now();
  auto idle_since = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    bool busy = RunQueued();
    while (ucp_worker_progress(worker_) != 0) busy = true;
    auto now = Clock::now();
    if (now >= next_tick) {
      if (tick) tick();
      next_tick = now + std::chrono::milliseconds(20);
    }
    if (busy) {
      idle_since = now;
      continue;
    }
    // Idle: poll on for kSpin (the answer to what was just sent often comes in that time),
    // yielding the core between polls, so that a thread woken on this core (the application's,
    // the peer's on a machine with few cores) runs now rather than after this one's time slice.
    if (mode_ == UcxOptions::Progress::kPolling || now - idle_since < kSpin) {
      sched_yield();
      continue;
    }
    // Idle for a while: sleep on the event fd until UCX or Submit() wakes us, or the next tick.
    sleeping_.store(true, std::memory_order_seq_cst);
    if (!queued_.load(std::memory_order_seq_cst) && !stop_.load(std::memory_order_acquire) &&
        ucp_worker_arm(worker_) == UCS_OK) {
      pollfd pfd{efd_, POLLIN, 0};
      poll(&pfd, 1, outstanding && outstanding() ? 1 : 20);
    }
    sleeping_.store(false, std::memory_order_relaxed);
    idle_since = Clock::now();
  }
  // Drain: run what was submitted before Stop(), then the last callback, progressing UCX so
  // that the closing of endpoints can complete.
  RunQueued();
  std::function<void()> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = std::move(last_);
  }
  if (last) last();
  RunQueued();
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

}  // namespace ferry::internal::ucx
