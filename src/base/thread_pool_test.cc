#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>

namespace ferry {
namespace {

TEST(ThreadPool, RunsEveryTaskBeforeDestruction) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(3, "test");
    EXPECT_EQ(pool.size(), 3);
    for (int i = 0; i < 1000; ++i) pool.Submit([&] { count.fetch_add(1); });
  }
  EXPECT_EQ(count.load(), 1000);
}

TEST(ThreadPool, TasksMaySubmitTasks) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(2, "test");
    for (int i = 0; i < 10; ++i)
      pool.Submit([&] {
        count.fetch_add(1);
        pool.Submit([&] { count.fetch_add(1); });
      });
  }
  EXPECT_EQ(count.load(), 20);
}

}  // namespace
}  // namespace ferry
