// ThreadPool: a fixed set of worker threads running submitted tasks in FIFO order.
//
// Thread safety: Submit() may be called from any thread, including from a task. The destructor
// runs every task already submitted, then joins the workers.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry {

class ThreadPool {
 public:
  // REQUIRES: threads >= 1
  ThreadPool(int threads, std::string name);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> workers_;
};

}  // namespace ferry
