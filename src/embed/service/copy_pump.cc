#include "embed/service/copy_pump.h"

#include <algorithm>

#include "embed/start_thread.h"

namespace ferry::embed::service {

Result<std::unique_ptr<CopyPump>> CopyPump::Create() {
  std::unique_ptr<CopyPump> pump(new CopyPump());
  FERRY_ASSIGN_OR_RETURN(pump->thread_, StartThread("copy pump", [p = pump.get()] { p->Loop(); }));
  return pump;
}

CopyPump::~CopyPump() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cancel_ = true;
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void CopyPump::Begin(int64_t num_tokens, int64_t chunk_tokens, int64_t min_tokens, Issue issue) {
  MutexLock lock(&mu_);
  num_tokens_ = num_tokens;
  chunk_tokens_ = std::max<int64_t>(1, chunk_tokens);
  min_tokens_ = std::max<int64_t>(1, min_tokens);
  chunks_ = (num_tokens_ + chunk_tokens_ - 1) / chunk_tokens_;
  if (static_cast<size_t>(chunks_) > done_capacity_) {
    done_capacity_ = static_cast<size_t>(chunks_);
    done_ = std::make_unique<std::atomic<uint8_t>[]>(done_capacity_);
  }
  for (int64_t c = 0; c < chunks_; ++c) done_[c].store(0, std::memory_order_relaxed);
  issue_ = std::move(issue);
  result_ = Status::Ok();
  issued_any_ = false;
  cancel_ = false;
  finished_ = false;
  active_ = true;
  cv_.NotifyAll();
}

void CopyPump::ChunkDone(int64_t begin, int64_t end) {
  (void)end;
  done_[begin / chunk_tokens_].store(1);  // seq_cst: pairs with sleeping_ (see RunLayer)
  if (sleeping_.load()) {
    MutexLock lock(&mu_);
    cv_.NotifyAll();
  }
}

Status CopyPump::End(bool complete, Deadline deadline, Clock::time_point* last_issue) {
  if (!complete) cancel_ = true;
  MutexLock lock(&mu_);
  cv_.NotifyAll();
  if (!done_cv_.WaitUntil(&mu_, deadline.at(), [&]() REQUIRES(mu_) { return finished_; })) {
    cancel_ = true;
    cv_.NotifyAll();
    // The pump stops after the copy in progress; a stuck copy call is waited for (bounded by
    // the driver), since the pump still refers to the layer's staging.
    done_cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return finished_; });
    active_ = false;
    return Status(Code::kDeadlineExceeded, "the copies of a layer were not issued in time");
  }
  active_ = false;
  if (issued_any_ && last_issue != nullptr) *last_issue = last_issue_;
  return result_;
}

void CopyPump::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stopping_ || (active_ && !finished_); });
      if (stopping_) return;
    }
    RunLayer();
  }
}

void CopyPump::RunLayer() {
  Status error;
  Clock::time_point last{};
  bool any = false;
  int64_t issued = 0, ready = 0;  // chunks [0, issued) copied, [0, ready) gathered
  while (issued < chunks_ && !cancel_) {
    while (ready < chunks_ && Ready(ready)) ++ready;
    const int64_t ready_tokens = std::min(ready * chunk_tokens_, num_tokens_);
    const int64_t issued_tokens = issued * chunk_tokens_;
    if (ready > issued && (ready == chunks_ || ready_tokens - issued_tokens >= min_tokens_)) {
      Status s = issue_(issued_tokens, ready_tokens);
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
      more = Ready(ready);
      if (!more) std::this_thread::yield();
    }
    if (more) continue;
    MutexLock lock(&mu_);
    sleeping_.store(true);  // seq_cst: either ChunkDone sees it, or this sees the chunk
    cv_.WaitFor(&mu_, std::chrono::microseconds(200),
                [&] { return cancel_.load() || Ready(ready); });
    sleeping_.store(false);
  }
  MutexLock lock(&mu_);
  result_ = error;
  if (any) {
    last_issue_ = last;
    issued_any_ = true;
  }
  finished_ = true;
  done_cv_.NotifyAll();
}

}  // namespace ferry::embed::service
