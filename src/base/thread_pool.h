// ThreadPool: a fixed set of worker threads running submitted tasks in FIFO order.
//
// Thread safety: Submit() may be called from any thread, including from a task. The destructor
// runs every task already submitted, then joins the workers.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "ferry/status.h"

namespace ferry {

// Starts a thread named `name` (at most 15 characters are kept) running `fn`; a thread the
// system cannot give is kResourceExhausted, not an exception.
Result<std::thread> StartThread(const std::string& name, std::function<void()> fn);

class ThreadPool {
 public:
  // The most workers one pool may have.
  static constexpr int kMaxThreads = 1024;

  // kInvalidArgument unless 1 <= threads <= kMaxThreads; kResourceExhausted when a thread cannot
  // start (RLIMIT_NPROC, a container's pids.max, memory): the threads that did start are joined.
  static Result<std::unique_ptr<ThreadPool>> Create(int threads, std::string name);

  // REQUIRES: 1 <= threads <= kMaxThreads, and that threads can start (tests); elsewhere use Create.
  ThreadPool(int threads, std::string name);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task) EXCLUDES(mu_);
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  ThreadPool() = default;
  Status Start(int threads, const std::string& name) EXCLUDES(mu_);
  void Run() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace ferry
