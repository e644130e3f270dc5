#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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

TEST(ThreadPool, CreateRejectsCountsOutOfRange) {
  for (int n : {0, -1, ThreadPool::kMaxThreads + 1, 100000}) {
    auto pool = ThreadPool::Create(n, "test");
    ASSERT_FALSE(pool.ok()) << n;
    EXPECT_EQ(pool.status().code(), Code::kInvalidArgument) << pool.status().ToString();
  }
  auto pool = ThreadPool::Create(2, "test");
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->size(), 2);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FERRY_SANITIZED 1
#endif
#endif

// A thread that cannot start is an error the caller sees, not std::terminate: in a child whose
// address space is capped, 1000 threads of 8 MiB stacks cannot all start.
TEST(ThreadPool, ThreadsThatCannotStartAreResourceExhausted) {
#ifdef FERRY_SANITIZED
  GTEST_SKIP() << "the sanitizers' own allocations fail under an address-space cap";
#else
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit cap = {1ull << 30, 1ull << 30};  // 1 GiB: a few dozen default stacks
    if (setrlimit(RLIMIT_AS, &cap) != 0) _exit(3);
    auto pool = ThreadPool::Create(ThreadPool::kMaxThreads, "capped");
    if (pool.ok()) _exit(4);
    _exit(pool.status().code() == Code::kResourceExhausted ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

}  // namespace
}  // namespace ferry
