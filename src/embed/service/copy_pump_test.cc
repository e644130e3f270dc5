// CopyPump: every token copied exactly once, in contiguous runs of at least min_tokens (but
// the last), whatever order the chunks finish in; cancellation; issue errors; two layers in
// flight, their completions in order; bounded waits.
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
    auto ticket = pump.Begin(tokens, chunk, min_tokens, [&](int64_t b, int64_t e) {
      MutexLock lock(&rec.mu);
      rec.runs.push_back({b, e});
      return Status::Ok();
    });
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    std::vector<int64_t> order;
    for (int64_t b = 0; b < tokens; b += chunk) order.push_back(b);
    std::shuffle(order.begin(), order.end(), std::mt19937(round));
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        for (size_t i = t; i < order.size(); i += 3)
          pump.ChunkDone(*ticket, order[i], std::min(tokens, order[i] + chunk));
      });
    for (auto& th : threads) th.join();
    Clock::time_point last{};
    ASSERT_TRUE(pump.End(*ticket, true, Deadline::After(std::chrono::seconds(10)), &last).ok());
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
  const CopyPump::Ticket t1 = *pump.Begin(10, 64, 1, [&](int64_t b, int64_t e) {
    runs.push_back({b, e});
    return Status::Ok();
  });
  pump.ChunkDone(t1, 0, 10);
  ASSERT_TRUE(pump.End(t1, true, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], std::make_pair(int64_t{0}, int64_t{10}));
}

TEST(CopyPumpTest, IssueErrorIsReturned) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  const CopyPump::Ticket t2 = *pump.Begin(64, 16, 16, [&](int64_t b, int64_t e) {
    return e == 64 ? Status(Code::kInternal, "copy failed") : Status::Ok();
  });
  for (int64_t b = 0; b < 64; b += 16) pump.ChunkDone(t2, b, b + 16);
  EXPECT_EQ(pump.End(t2, true, Deadline::After(std::chrono::seconds(10)), nullptr).code(),
            Code::kInternal);
}

TEST(CopyPumpTest, IncompleteLayerIsCancelled) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  int64_t copied = 0;
  const CopyPump::Ticket t3 = *pump.Begin(64, 16, 16, [&](int64_t b, int64_t e) {
    copied += e - b;
    return Status::Ok();
  });
  pump.ChunkDone(t3, 0, 16);
  pump.ChunkDone(t3, 32, 48);  // chunk 1 never comes
  EXPECT_TRUE(pump.End(t3, false, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_LE(copied, 16);
  // The pump serves the next layer.
  bool ran = false;
  const CopyPump::Ticket t4 = *pump.Begin(8, 8, 8, [&](int64_t, int64_t) {
    ran = true;
    return Status::Ok();
  });
  pump.ChunkDone(t4, 0, 8);
  EXPECT_TRUE(pump.End(t4, true, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_TRUE(ran);
}

TEST(CopyPumpTest, MissingChunkHitsTheDeadline) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  const CopyPump::Ticket t5 = *pump.Begin(32, 16, 16, [](int64_t, int64_t) { return Status::Ok(); });
  pump.ChunkDone(t5, 16, 32);
  EXPECT_EQ(pump.End(t5, true, Deadline::After(std::chrono::milliseconds(20)), nullptr).code(),
            Code::kDeadlineExceeded);
}

TEST(CopyPumpTest, TwoLayersInFlightCompleteInOrder) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  Recorded rec;  // runs of both layers; `first` < 0 marks a completion (-1 - layer)
  auto issue = [&rec](int layer) {
    return [&rec, layer](int64_t b, int64_t e) {
      MutexLock lock(&rec.mu);
      rec.runs.push_back({layer * 1000 + b, layer * 1000 + e});
      return Status::Ok();
    };
  };
  auto complete = [&rec](int layer) {
    return [&rec, layer] {
      MutexLock lock(&rec.mu);
      rec.runs.push_back({-1 - layer, 0});
      return Status::Ok();
    };
  };
  auto a = pump.Begin(64, 16, 64, issue(0), complete(0));  // one copy: all 64 tokens
  auto b = pump.Begin(64, 16, 16, issue(1), complete(1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(pump.in_flight(), 2);
  // A third layer waits for the first to end.
  EXPECT_EQ(pump.Begin(8, 8, 8, issue(2)).status().code(), Code::kFailedPrecondition);
  // The second layer's chunks all finish before the first's last one: still served in order.
  for (int64_t c = 0; c < 64; c += 16) pump.ChunkDone(*b, c, c + 16);
  for (int64_t c = 0; c < 48; c += 16) pump.ChunkDone(*a, c, c + 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    MutexLock lock(&rec.mu);
    for (const auto& r : rec.runs) EXPECT_LT(r.first, 1000) << "layer 1 copied before layer 0";
  }
  pump.ChunkDone(*a, 48, 64);
  Clock::time_point done_a{}, done_b{};
  ASSERT_TRUE(pump.End(*a, true, Deadline::After(std::chrono::seconds(10)), nullptr, &done_a).ok());
  ASSERT_TRUE(pump.End(*b, true, Deadline::After(std::chrono::seconds(10)), nullptr, &done_b).ok());
  EXPECT_NE(done_a, Clock::time_point{});
  EXPECT_LE(done_a, done_b);
  EXPECT_EQ(pump.in_flight(), 0);
  MutexLock lock(&rec.mu);
  std::vector<std::pair<int64_t, int64_t>> want = {{0, 64}, {-1, 0}, {1000, 1064}, {-2, 0}};
  EXPECT_EQ(rec.runs, want);
}

TEST(CopyPumpTest, FailedCompletionFailsTheLayerAndCancelledLayerSkipsIt) {
  auto created = CopyPump::Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyPump& pump = **created;
  auto ok = [](int64_t, int64_t) { return Status::Ok(); };
  bool completed_b = false;
  auto a = pump.Begin(16, 16, 16, ok, [] { return Status(Code::kUnavailable, "flag"); });
  auto b = pump.Begin(32, 16, 16, ok, [&] {
    completed_b = true;
    return Status::Ok();
  });
  ASSERT_TRUE(a.ok() && b.ok());
  pump.ChunkDone(*a, 0, 16);
  pump.ChunkDone(*b, 0, 16);  // the second chunk of b never comes
  EXPECT_EQ(pump.End(*a, true, Deadline::After(std::chrono::seconds(10)), nullptr).code(),
            Code::kUnavailable);
  EXPECT_TRUE(pump.End(*b, false, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_FALSE(completed_b);
}

TEST(CopyPumpTest, PinsItsThreadToTheCpusAsked) {
  std::vector<int> cpus = AllowedCpus();
  ASSERT_FALSE(cpus.empty());
  auto created = CopyPump::Create({cpus.back()});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  int seen = -1;
  auto t = (*created)->Begin(1, 1, 1, [&](int64_t, int64_t) {
    seen = sched_getcpu();
    return Status::Ok();
  });
  ASSERT_TRUE(t.ok());
  (*created)->ChunkDone(*t, 0, 1);
  ASSERT_TRUE((*created)->End(*t, true, Deadline::After(std::chrono::seconds(10)), nullptr).ok());
  EXPECT_EQ(seen, cpus.back());
}

TEST(CopyPumpTest, AThreadThatCannotStartIsResourceExhausted) {
  FailThreadStartsForTesting(1);
  auto pump = CopyPump::Create();
  EXPECT_EQ(pump.status().code(), Code::kResourceExhausted) << pump.status().ToString();
  EXPECT_TRUE(CopyPump::Create().ok());  // only the one start failed
}

}  // namespace
}  // namespace ferry::embed::service
