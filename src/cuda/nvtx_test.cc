// NvtxRange builds with and without CUDA (this test is in both builds), nests per thread, and
// costs little while no profiler is attached (a range per batch must not slow a post down).
#include "cuda/nvtx.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <type_traits>
#include <vector>

namespace ferry::cuda {
namespace {

static_assert(!std::is_copy_constructible_v<NvtxRange> && !std::is_copy_assignable_v<NvtxRange>,
              "a range is popped once, by its owner");

TEST(NvtxRange, NestsOnManyThreadsAndIsCheapWithoutAProfiler) {
  constexpr int kRanges = 100'000;
  std::vector<std::thread> threads;
  std::vector<double> seconds(4);
  for (size_t t = 0; t < seconds.size(); ++t) {
    threads.emplace_back([&seconds, t] {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kRanges; ++i) {
        NvtxRange outer("ferry test outer");
        NvtxRange inner("ferry test inner");
      }
      seconds[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& th : threads) th.join();
  for (double s : seconds) EXPECT_LT(s / (2.0 * kRanges), 1e-6) << "a range should cost well under 1 us";
}

}  // namespace
}  // namespace ferry::cuda
