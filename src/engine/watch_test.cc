// Engine::WatchNotifications: a waiting thread is woken by an arrival of its topic, without
// anyone polling the engine, over the local and shm transports.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "testing/engine_pair.h"

namespace ferry::testing {
namespace {

using namespace std::chrono_literals;

class WatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WatchTest, AnArrivalOfTheTopicCallsItsWatcherWithoutPolling) {
  auto p = EnginePair::Make(GetParam(), 4096, {}, HostAlloc::kShared);
  ASSERT_NE(p, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  p->b->WatchNotifications("kv", [&] {
    std::lock_guard<std::mutex> l(mu);
    ++calls;
    cv.notify_all();
  });
  ASSERT_TRUE(p->a->Notify(p->b->key(), "other topic", "app").ok());
  ASSERT_TRUE(p->a->Notify(p->b->key(), "one", "kv").ok());
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, 5s, [&] { return calls >= 1; })) << "no call without polling";
  }
  std::this_thread::sleep_for(50ms);
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(calls, 1) << "another topic's arrival called the watcher";
  }
  auto got = p->b->PopNotifications("kv");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "one");
  EXPECT_EQ(p->b->PopNotifications("app").size(), 1u);
  // Removed: later arrivals call nothing.
  p->b->WatchNotifications("kv", nullptr);
  ASSERT_TRUE(p->a->Notify(p->b->key(), "two", "kv").ok());
  const auto until = std::chrono::steady_clock::now() + 5s;
  std::vector<Notification> late;
  while (late.empty() && std::chrono::steady_clock::now() < until) {
    late = p->b->PopNotifications("kv");
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(late.size(), 1u);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(calls, 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, WatchTest, ::testing::Values("local", "shm", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::testing
