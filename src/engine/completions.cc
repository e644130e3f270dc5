#include "engine/completions.h"

#include <algorithm>
#include <system_error>

namespace ferry::internal {

Result<std::shared_ptr<Completions>> Completions::Create() {
  std::shared_ptr<Completions> c(new Completions());
  try {
    // The thread holds the object: it may outlive the engine when a callback destroys it.
    c->thread_ = std::thread([self = c] { self->Run(); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("cannot start the completion thread: ") + e.what());
  }
  return c;
}

Completions::~Completions() {
  // Only the thread's own reference is left once it ends; a joinable thread here is the
  // completion thread destroying its own object on its way out.
  if (thread_.joinable()) thread_.detach();
}

void Completions::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (!thread_.joinable()) return;
  // From a callback (the engine destroyed on the completion thread): the thread ends on its
  // own after this callback, having run what is queued.
  if (thread_.get_id() == std::this_thread::get_id()) return;
  thread_.join();
}

uint64_t Completions::callbacks_run() const {
  MutexLock lock(&mu_);
  return callbacks_run_;
}

void Completions::Attach(const std::shared_ptr<TransferState>& state, Callback fn) {
  if (state->finished()) {
    fn(state->status());
    MutexLock lock(&mu_);
    ++callbacks_run_;
    return;
  }
  std::weak_ptr<Completions> weak = weak_from_this();
  state->OnFinish([weak, fn = std::move(fn)](const Status& s) mutable {
    if (auto self = weak.lock()) return self->Dispatch(std::move(fn), s);
    fn(s);
  });
  Watch(state);
}

void Completions::Watch(const std::shared_ptr<TransferState>& state) {
  if (state->finished() || state->deadline().at() == Clock::time_point::max()) return;
  bool earliest;
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    if (deadlines_.size() >= prune_at_) {
      std::erase_if(deadlines_, [](const Entry& e) {
        auto s = e.state.lock();
        return !s || s->finished();
      });
      std::make_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
      prune_at_ = std::max<size_t>(1024, 2 * deadlines_.size());
    }
    deadlines_.push_back(Entry{state->deadline().at(), state});
    std::push_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
    earliest = deadlines_.front().state.lock() == state;
  }
  if (earliest) cv_.NotifyAll();
}

void Completions::Dispatch(Callback fn, const Status& status) {
  {
    MutexLock lock(&mu_);
    if (!stopping_ || thread_.get_id() == std::this_thread::get_id()) {
      ready_.emplace_back(std::move(fn), status);
      cv_.NotifyAll();
      return;
    }
    ++callbacks_run_;
  }
  fn(status);
}

void Completions::Run() {
  std::vector<std::shared_ptr<TransferState>> expired;
  mu_.Lock();
  while (true) {
    if (!ready_.empty()) {
      auto batch = std::move(ready_);
      ready_.clear();
      callbacks_run_ += batch.size();
      mu_.Unlock();
      for (auto& [fn, status] : batch) fn(status);
      batch.clear();  // the callbacks' captures die without the lock
      mu_.Lock();
      continue;
    }
    if (stopping_) break;
    const Clock::time_point now = Clock::now();
    while (!deadlines_.empty() && deadlines_.front().at <= now) {
      std::pop_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
      if (auto s = deadlines_.back().state.lock()) expired.push_back(std::move(s));
      deadlines_.pop_back();
    }
    if (!expired.empty()) {
      mu_.Unlock();
      // Test() finishes a transfer whose deadline passed; its callbacks are queued above.
      for (auto& s : expired) (void)s->Test();
      expired.clear();
      mu_.Lock();
      continue;
    }
    if (deadlines_.empty()) {
      cv_.Wait(&mu_);
    } else {
      (void)cv_.WaitUntil(&mu_, deadlines_.front().at);
    }
  }
  mu_.Unlock();
  // Stopped: callbacks of transfers that finish from now on run where they finish.
}

}  // namespace ferry::internal
