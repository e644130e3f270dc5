#include "base/thread_pool.h"

#include <pthread.h>

#include <cstdlib>
#include <system_error>

namespace ferry {

Result<std::unique_ptr<ThreadPool>> ThreadPool::Create(int threads, std::string name) {
  if (threads < 1 || threads > kMaxThreads)
    return Status(Code::kInvalidArgument, name + ": " + std::to_string(threads) + " threads asked for; must be in 1.." +
                                              std::to_string(kMaxThreads));
  std::unique_ptr<ThreadPool> pool(new ThreadPool());
  FERRY_RETURN_IF_ERROR(pool->Start(threads, name));
  return pool;
}

Result<std::thread> StartThread(const std::string& name, std::function<void()> fn) {
  std::thread t;
  try {
    t = std::thread(std::move(fn));
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, "cannot start thread " + name + ": " + e.what());
  }
  pthread_setname_np(t.native_handle(), name.substr(0, 15).c_str());
  return t;
}

ThreadPool::ThreadPool(int threads, std::string name) {
  Status s = Start(threads < 1 ? 1 : threads, name);
  if (!s.ok()) std::abort();  // tests only (see the header); the library uses Create
}

Status ThreadPool::Start(int threads, const std::string& name) {
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    try {
      workers_.emplace_back([this] { Run(); });
    } catch (const std::system_error& e) {
      int started = static_cast<int>(workers_.size());
      {
        MutexLock lock(&mu_);
        stopping_ = true;
      }
      cv_.NotifyAll();
      for (auto& t : workers_) t.join();
      workers_.clear();
      return Status(Code::kResourceExhausted, name + ": cannot start thread " + std::to_string(started + 1) + " of " +
                                                  std::to_string(threads) + ": " + e.what());
    }
    std::string thread_name = (name + "-" + std::to_string(i)).substr(0, 15);
    pthread_setname_np(workers_.back().native_handle(), thread_name.c_str());
  }
  return Status::Ok();
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.NotifyOne();
}

void ThreadPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace ferry
