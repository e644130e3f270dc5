#include "embed/service/copy_pump.h"

#include <pthread.h>

#include <algorithm>

#include "embed/start_thread.h"

namespace ferry::embed::service {

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

bool PinThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set) == 0;
}

Result<std::unique_ptr<CopyPump>> CopyPump::Create(std::vector<int> cpus) {
  std::unique_ptr<CopyPump> pump(new CopyPump());
  // The thread pins itself before its first layer; pinned_ is written before it starts.
  pump->pinned_ = std::move(cpus);
  FERRY_ASSIGN_OR_RETURN(pump->thread_, StartThread("copy pump", [p = pump.get()] {
                           if (!p->pinned_.empty()) (void)PinThisThread(p->pinned_);
                           p->Loop();
                         }));
  return pump;
}

CopyPump::~CopyPump() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (Layer& l : layers_) l.cancel = true;
  cv_.NotifyAll();
  // A copy call that never returns keeps this join waiting (the driver's bound): the pump's
  // layer still refers to its caller's buffers, so it cannot be abandoned.
  if (thread_.joinable()) thread_.join();
}

int CopyPump::in_flight() const {
  MutexLock lock(&mu_);
  return static_cast<int>(begun_ - ended_);
}

Result<CopyPump::Ticket> CopyPump::Begin(int64_t num_tokens, int64_t chunk_tokens,
                                         int64_t min_tokens, Issue issue, Complete complete) {
  MutexLock lock(&mu_);
  if (stuck_) return Status(Code::kUnavailable, "the copy pump is stuck in a copy call");
  if (begun_ - ended_ >= static_cast<Ticket>(kDepth))
    return Status(Code::kFailedPrecondition, "the copy pump has its most layers in flight");
  const Ticket t = begun_;
  Layer& l = At(t);
  l.num_tokens = num_tokens;
  l.chunk_tokens = std::max<int64_t>(1, chunk_tokens);
  l.min_tokens = std::max<int64_t>(1, min_tokens);
  l.chunks = (l.num_tokens + l.chunk_tokens - 1) / l.chunk_tokens;
  if (static_cast<size_t>(l.chunks) > l.done_capacity) {
    l.done_capacity = static_cast<size_t>(l.chunks);
    l.done = std::make_unique<std::atomic<uint8_t>[]>(l.done_capacity);
  }
  for (int64_t c = 0; c < l.chunks; ++c) l.done[c].store(0, std::memory_order_relaxed);
  l.issue = std::move(issue);
  l.complete = std::move(complete);
  l.result = Status::Ok();
  l.issued_any = false;
  l.ran_complete = false;
  l.cancel = false;
  l.finished = false;
  ++begun_;
  cv_.NotifyAll();
  return t;
}

void CopyPump::ChunkDone(Ticket ticket, int64_t begin, int64_t end) {
  (void)end;
  Layer& l = At(ticket);
  l.done[begin / l.chunk_tokens].store(1);  // seq_cst: pairs with sleeping_ (see RunLayer)
  if (sleeping_.load()) {
    MutexLock lock(&mu_);
    cv_.NotifyAll();
  }
}

Status CopyPump::End(Ticket ticket, bool complete, Deadline deadline,
                     Clock::time_point* last_issue, Clock::time_point* completed) {
  Layer& l = At(ticket);
  if (!complete) l.cancel = true;
  MutexLock lock(&mu_);
  if (stuck_) return Status(Code::kUnavailable, "the copy pump is stuck in a copy call");
  cv_.NotifyAll();
  Status timeout;
  if (!done_cv_.WaitUntil(&mu_, deadline.at(), [&]() REQUIRES(mu_) { return l.finished; })) {
    l.cancel = true;
    cv_.NotifyAll();
    timeout = Status(Code::kDeadlineExceeded, "the copies of a layer were not issued in time");
    // The pump stops after the copy in progress, which still reads the caller's buffer: wait
    // for it a while longer, then give up on this pump.
    if (!done_cv_.WaitUntil(&mu_, Deadline::After(kStuckGrace).at(),
                            [&]() REQUIRES(mu_) { return l.finished; })) {
      stuck_ = true;
      return Status(Code::kDeadlineExceeded, "the copy pump is stuck in a copy call");
    }
  }
  ++ended_;
  if (!timeout.ok()) return timeout;
  if (l.issued_any && last_issue != nullptr) *last_issue = l.last_issue;
  if (l.ran_complete && completed != nullptr) *completed = l.completed;
  return l.result;
}

void CopyPump::Loop() {
  for (;;) {
    Layer* l = nullptr;
    {
      MutexLock lock(&mu_);
      // Bounded like every wait here: the predicate is checked again at least every 100 ms.
      while (!stopping_ && serving_ >= begun_)
        cv_.WaitFor(&mu_, std::chrono::milliseconds(100),
                    [&]() REQUIRES(mu_) { return stopping_ || serving_ < begun_; });
      if (stopping_) return;
      l = &At(serving_);
    }
    RunLayer(*l);
    MutexLock lock(&mu_);
    ++serving_;
  }
}

void CopyPump::RunLayer(Layer& l) {
  Status error;
  Clock::time_point last{}, completed{};
  bool any = false, ran_complete = false;
  int64_t issued = 0, ready = 0;  // chunks [0, issued) copied, [0, ready) gathered
  while (issued < l.chunks && !l.cancel) {
    while (ready < l.chunks && Ready(l, ready)) ++ready;
    const int64_t ready_tokens = std::min(ready * l.chunk_tokens, l.num_tokens);
    const int64_t issued_tokens = issued * l.chunk_tokens;
    if (ready > issued && (ready == l.chunks || ready_tokens - issued_tokens >= l.min_tokens)) {
      Status s = l.issue(issued_tokens, ready_tokens);
      if (!s.ok() && error.ok()) error = s;
      issued = ready;
      last = Clock::now();
      any = true;
      copies_++;
      continue;
    }
    // Wait for the next chunk: spin briefly (chunks finish every few microseconds), then sleep
    // until a gather thread wakes the pump (or a short timeout, as a backstop).
    bool more = false;
    for (int spin = 0; spin < 64 && !more; ++spin) {
      more = Ready(l, ready);
      if (!more) std::this_thread::yield();
    }
    if (more) continue;
    MutexLock lock(&mu_);
    sleeping_.store(true);  // seq_cst: either ChunkDone sees it, or this sees the chunk
    cv_.WaitFor(&mu_, std::chrono::microseconds(200),
                [&] { return l.cancel.load() || Ready(l, ready); });
    sleeping_.store(false);
  }
  if (error.ok() && issued == l.chunks && !l.cancel && l.complete) {
    error = l.complete();
    completed = Clock::now();
    ran_complete = true;
  }
  MutexLock lock(&mu_);
  l.result = error;
  l.issued_any = any;
  if (any) l.last_issue = last;
  l.ran_complete = ran_complete;
  l.completed = completed;
  l.finished = true;
  done_cv_.NotifyAll();
}

}  // namespace ferry::embed::service
