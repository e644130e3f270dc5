// CopyPump: every token copied exactly once, in contiguous runs of at least min_tokens (but
// the last), whatever order the chunks finish in; cancellation; issue errors.
#include "embed/service/copy_pump.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "embed/start_thread.h"

namespace ferry::embed::service {
namespace {

struct Recorded {
  Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> runs GUARDED_BY(mu);
};

TEST(CopyPumpTest, CoalescesContiguousFinishedChunksInAnyOrder) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  for (int round = 0; round < 20; ++round) {
    const int64_t tokens = 1000 + round * 37, chunk = 16, min_tokens = 100;
    Recorded rec;
    pump.Begin(tokens, chunk, min_tokens, [&](int64_t b, int64_t e) {
      MutexLock lock(&rec.mu);
      rec.runs.push_back({b, e});
      return Status::Ok();
    });
    std::vector<int64_t> order;
    for (int64_t b = 0; b < tokens; b += chunk) order.push_back(b);
    std::shuffle(order.begin(), order.end(), std::mt19937(round));
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        for (size_t i = t; i < order.size(); i += 3)
          pump.ChunkDone(order[i], std::min(tokens, order[i] + chunk));
      });
    for (auto& th : threads) th.join();
    Clock::time_point last{};
    ASSERT_TRUE(pump.End(true, Deadline::After(std::chrono::seconds(10)), &last).ok());
    EXPECT_NE(last, Clock::time_point{});
    MutexLock lock(&rec.mu);  // the pump is done with the layer: this only satisfies the analysis
    ASSERT_FALSE(rec.runs.empty());
    int64_t next = 0;
    for (size_t i = 0; i < rec.runs.size(); ++i) {
      EXPECT_EQ(rec.runs[i].first, next) << "runs are contiguous and in order";
      if (i + 1 < rec.runs.size()) {
        EXPECT_GE(rec.runs[i].second - rec.runs[i].first, min_tokens);
      }
      next = rec.runs[i].second;
    }
    EXPECT_EQ(next, tokens);
  }
}

TEST(CopyPumpTest, OneChunkAndSmallMinimum) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  std::vector<std::pair<int64_t, int64_t>> runs;
  pump.Begin(10, 64, 1, [&](int64_t b, int64_t e) {
    runs.push_back({b, e});
    return Status::Ok();
  });
  pump.ChunkDone(0, 10);
  ASSERT_TRUE(pump.End(true, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], std::make_pair(int64_t{0}, int64_t{10}));
}

TEST(CopyPumpTest, IssueErrorIsReturned) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  pump.Begin(64, 16, 16, [&](int64_t b, int64_t e) {
    return e == 64 ? Status(Code::kInternal, "copy failed") : Status::Ok();
  });
  for (int64_t b = 0; b < 64; b += 16) pump.ChunkDone(b, b + 16);
  EXPECT_EQ(pump.End(true, Deadline::After(std::chrono::seconds(10)), nullptr).code(),
            Code::kInternal);
}

TEST(CopyPumpTest, IncompleteLayerIsCancelled) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  int64_t copied = 0;
  pump.Begin(64, 16, 16, [&](int64_t b, int64_t e) {
    copied += e - b;
    return Status::Ok();
  });
  pump.ChunkDone(0, 16);
  pump.ChunkDone(32, 48);  // chunk 1 never comes
  EXPECT_TRUE(pump.End(false, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_LE(copied, 16);
  // The pump serves the next layer.
  bool ran = false;
  pump.Begin(8, 8, 8, [&](int64_t, int64_t) {
    ran = true;
    return Status::Ok();
  });
  pump.ChunkDone(0, 8);
  EXPECT_TRUE(pump.End(true, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_TRUE(ran);
}

TEST(CopyPumpTest, MissingChunkHitsTheDeadline) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  pump.Begin(32, 16, 16, [](int64_t, int64_t) { return Status::Ok(); });
  pump.ChunkDone(16, 32);
  EXPECT_EQ(pump.End(true, Deadline::After(std::chrono::milliseconds(20)), nullptr).code(),
            Code::kDeadlineExceeded);
}

TEST(CopyPumpTest, AThreadThatCannotStartIsResourceExhausted) {
  FailThreadStartsForTesting(1);
  auto pump = CopyPump::Create();
  EXPECT_EQ(pump.status().code(), Code::kResourceExhausted) << pump.status().ToString();
  EXPECT_TRUE(CopyPump::Create().ok());  // only the one start failed
}

}  // namespace
}  // namespace ferry::embed::service
