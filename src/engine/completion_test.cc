// Completion without a thread per transfer: TransferOptions::on_complete (exactly once, on the
// engine's completion thread, by the deadline of a transfer nobody waits on), and WaitAll /
// WaitAny over transfers that complete in the test's order (testing/held_transport.h).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "base/mutex.h"
#include "testing/held_engines.h"

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

// The calls of one callback: how many, with which status, on which thread.
class Calls {
 public:
  std::function<void(const Status&)> Fn() {
    return [this](const Status& s) {
      // Notifies under the lock: a waiter that sees the count may destroy this Calls (a test's
      // local) as soon as it returns, so nothing here may touch it after the unlock.
      MutexLock lock(&mu_);
      ++count_;
      last_ = s;
      thread_ = std::this_thread::get_id();
      cv_.NotifyAll();
    };
  }
  // Waits up to `d` for at least `n` calls; returns the count.
  int WaitFor(int n, std::chrono::milliseconds d = 5s) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, d, [&]() REQUIRES(mu_) { return count_ >= n; });
    return count_;
  }
  int Count() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return count_;
  }
  Status Last() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return last_;
  }
  std::thread::id Thread() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return thread_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int count_ GUARDED_BY(mu_) = 0;
  Status last_ GUARDED_BY(mu_);
  std::thread::id thread_ GUARDED_BY(mu_);
};

class CompletionTest : public HeldEnginesTest {
 protected:
  TransferOptions WithCallback(Calls& c, Duration deadline = 10s) {
    TransferOptions o;
    o.on_complete = c.Fn();
    o.deadline = deadline;
    return o;
  }
};

TEST_F(CompletionTest, ACallbackRunsOnceOnTheCompletionThreadOnSuccess) {
  Calls c;
  Transfer t = WriteLayer(0, WithCallback(c));
  EXPECT_EQ(c.Count(), 0);
  ASSERT_TRUE(held().Release(0));
  ASSERT_EQ(c.WaitFor(1), 1);
  EXPECT_TRUE(c.Last().ok()) << c.Last().ToString();
  EXPECT_NE(c.Thread(), std::this_thread::get_id());
  EXPECT_TRUE(LayerInPlace(0));
  EXPECT_TRUE(t.Wait().ok());
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(c.Count(), 1);
}

TEST_F(CompletionTest, ACallbackRunsOnceOnFailure) {
  Calls c;
  Transfer t = WriteLayer(1, WithCallback(c));
  ASSERT_TRUE(held().Release(0, Status(Code::kUnavailable, "link down")));
  ASSERT_EQ(c.WaitFor(1), 1);
  EXPECT_EQ(c.Last().code(), Code::kUnavailable);
  EXPECT_EQ(t.Wait().code(), Code::kUnavailable);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(c.Count(), 1);
}

// Nobody waits: the engine's completion thread ends the transfer at its deadline.
TEST_F(CompletionTest, ACallbackRunsAtTheDeadlineOfATransferNobodyWaitsOn) {
  Calls c;
  const auto start = std::chrono::steady_clock::now();
  Transfer t = WriteLayer(0, WithCallback(c, 100ms));
  ASSERT_EQ(c.WaitFor(1), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(c.Last().code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(t.Test());
  // The batch lands late: the transfer stays failed, the callback is not run again.
  ASSERT_TRUE(held().Release(0));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(c.Count(), 1);
  EXPECT_EQ(t.status().code(), Code::kDeadlineExceeded);
}

TEST_F(CompletionTest, ARefusedTransferRunsItsCallbackAtOnceOnTheCallersThread) {
  Calls c;
  TransferOp op{0, 0, kLayer + 1};
  Transfer t = sessions_[0]->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), WithCallback(c));
  ASSERT_EQ(c.Count(), 1);
  EXPECT_EQ(c.Last().code(), Code::kOutOfRange);
  EXPECT_EQ(c.Thread(), std::this_thread::get_id());
  Calls d;
  TransferOptions o = WithCallback(d);
  o.deadline = Duration::zero();
  (void)WriteLayer(0, o);
  EXPECT_EQ(d.Count(), 1);
  EXPECT_EQ(d.Last().code(), Code::kInvalidArgument);
  EXPECT_EQ(held().count(), 0u);
  // An empty session handle too.
  Calls e;
  Transfer none = Session().Write(0, 0, 1, WithCallback(e));
  EXPECT_EQ(e.Count(), 1);
  EXPECT_EQ(e.Last().code(), Code::kFailedPrecondition);
}

// A callback may post the next transfer (a connector chains layers this way).
TEST_F(CompletionTest, ACallbackMayPostTransfers) {
  Calls second;
  std::atomic<bool> posted{false};
  Transfer chained;
  Mutex mu;
  TransferOptions o;
  o.on_complete = [&](const Status& s) {
    ASSERT_TRUE(s.ok());
    MutexLock lock(&mu);
    TransferOptions next;
    next.on_complete = second.Fn();
    chained = WriteLayer(1, next);
    posted = true;
  };
  Transfer first = WriteLayer(0, o);
  ASSERT_TRUE(held().Release(0));
  for (int i = 0; i < 500 && !posted; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(posted);
  ASSERT_TRUE(held().Release(0));
  ASSERT_EQ(second.WaitFor(1), 1);
  EXPECT_TRUE(second.Last().ok());
  EXPECT_TRUE(LayerInPlace(0) && LayerInPlace(1));
}

// A transfer that ends unfinished after its engine stopped (its batch dropped) still runs its
// callback once, with kAborted, on the thread that drops it.
TEST_F(CompletionTest, ATransferDroppedAfterShutdownRunsItsCallback) {
  Calls c;
  (void)WriteLayer(0, WithCallback(c));
  sessions_.clear();
  a_->Shutdown();
  EXPECT_EQ(c.Count(), 0);
  held().Clear();  // the held batch, the transfer's last owner, is dropped
  ASSERT_EQ(c.WaitFor(1), 1);
  EXPECT_EQ(c.Last().code(), Code::kAborted);
  EXPECT_EQ(c.Thread(), std::this_thread::get_id());
}

TEST_F(CompletionTest, WaitAnyReturnsTheTransferThatFinishedFirst) {
  std::vector<Transfer> ts;
  for (int i = 0; i < 3; ++i) ts.push_back(WriteLayer(i));
  ASSERT_TRUE(held().Release(2));
  auto any = WaitAny(ts);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_EQ(*any, 2u);
  std::vector<Transfer> rest{ts[0], ts[1]};
  auto none = WaitAny(rest, 30ms);
  EXPECT_EQ(none.status().code(), Code::kInProgress);
  EXPECT_EQ(WaitAll(ts, 30ms).code(), Code::kInProgress);
  std::thread releaser([&] {
    std::this_thread::sleep_for(30ms);
    held().Release(1);  // layer 1, then layer 0
    std::this_thread::sleep_for(30ms);
    held().Release(0);
  });
  auto next = WaitAny(rest);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 1u);
  EXPECT_TRUE(WaitAll(ts).ok());
  releaser.join();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(LayerInPlace(i));
}

TEST_F(CompletionTest, WaitAllReturnsTheFirstErrorWithoutWaitingForTheRest) {
  std::vector<Transfer> ts;
  for (int i = 0; i < 3; ++i) ts.push_back(WriteLayer(i));
  ASSERT_TRUE(held().Release(2));
  ASSERT_TRUE(held().Release(0, Status(Code::kUnavailable, "peer gone")));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitAll(ts).code(), Code::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_FALSE(ts[1].Test());
}

TEST_F(CompletionTest, WaitsAreBoundedByTheEarliestDeadline) {
  TransferOptions quick, slow;
  quick.deadline = 100ms;
  slow.deadline = 10s;
  // Taken before the posts: the quick transfer's deadline runs from its post, so a start taken
  // after it would see the wait end a little under 100 ms later (seen under ASan: 99.8 ms).
  auto start = std::chrono::steady_clock::now();
  std::vector<Transfer> ts{WriteLayer(0, slow), WriteLayer(1, quick)};
  auto any = WaitAny(ts);
  EXPECT_EQ(any.status().code(), Code::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(ts[1].status().code(), Code::kDeadlineExceeded);
  auto again = WaitAny(ts);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 1u);

  std::vector<Transfer> more{WriteLayer(2, slow), WriteLayer(3, quick)};
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitAll(more).code(), Code::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST_F(CompletionTest, WaitOnNothingOrOnEmptyHandles) {
  EXPECT_TRUE(WaitAll({}).ok());
  EXPECT_EQ(WaitAny({}).status().code(), Code::kInvalidArgument);
  std::vector<Transfer> empty(2);
  EXPECT_EQ(WaitAll(empty).code(), Code::kFailedPrecondition);
  auto any = WaitAny(empty);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(*any, 0u);
}

// Many waits on the same running transfers leave no observer behind.
TEST_F(CompletionTest, RepeatedWaitsDoNotPileUpObservers) {
  std::vector<Transfer> ts{WriteLayer(0), WriteLayer(1)};
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(WaitAny(ts, 1us).status().code(), Code::kInProgress);
  const auto& s = TransferAccess::Of(ts[0]);
  // Observer 1 is the engine's metrics (it stays until the transfer ends); the waits' are 2..2001.
  EXPECT_FALSE(s->RemoveOnFinish(2)) << "the first wait's observer is still registered";
  EXPECT_FALSE(s->RemoveOnFinish(2001)) << "the last wait's observer is still registered";
  ASSERT_TRUE(held().Release(0) && held().Release(0));
  EXPECT_TRUE(WaitAll(ts).ok());
}

}  // namespace
}  // namespace ferry::internal
