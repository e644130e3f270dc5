#include "base/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace ferry {
namespace {

class Counter {
 public:
  void Add() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    ++n_;
    cv_.NotifyAll();
  }
  // Waits until the count reaches `n` or `timeout` passes; the count then.
  int WaitFor(int n, std::chrono::milliseconds timeout) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    cv_.WaitFor(&mu_, timeout, [&]() REQUIRES(mu_) { return n_ >= n; });
    return n_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int n_ GUARDED_BY(mu_) = 0;
};

TEST(Mutex, ExcludesOtherThreads) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.Add();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.WaitFor(40000, std::chrono::milliseconds(0)), 40000);
}

TEST(CondVar, WakesAWaiterAndTimesOut) {
  Counter c;
  std::thread adder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.Add();
  });
  EXPECT_EQ(c.WaitFor(1, std::chrono::seconds(30)), 1);
  adder.join();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.WaitFor(2, std::chrono::milliseconds(30)), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
}

TEST(Mutex, TryLockFailsWhileHeld) {
  Mutex mu;
  mu.Lock();
  bool got = true;
  std::thread other([&] {
    got = false;
    if (mu.TryLock()) {
      got = true;
      mu.Unlock();
    }
  });
  other.join();
  mu.Unlock();
  EXPECT_FALSE(got);
  bool relocked = false;
  if (mu.TryLock()) {
    relocked = true;
    mu.Unlock();
  }
  EXPECT_TRUE(relocked);
}

TEST(CondVar, WaitUntilReportsTheDeadline) {
  Mutex mu;
  CondVar cv;
  MutexLock l(&mu);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  while (cv.WaitUntil(&mu, until)) {
  }
  EXPECT_GE(std::chrono::steady_clock::now(), until);
}

}  // namespace
}  // namespace ferry
