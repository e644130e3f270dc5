// The connector's ends when a message is lost on the way (dropped on arrival): an allocation, a
// completion, a release, an abort confirmation. Every request must end on both sides exactly
// once, within its timeouts, with its blocks handed back, and no byte may land in a consumer
// block after the consumer's end.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "kv/connector_impl.h"
#include "kv/connector_test_util.h"

namespace ferry::kv::testing {
namespace {

using internal::ConnectorAccess;

struct Two {
  std::unique_ptr<Worker> p, d;
};

Two MakeTwo(ConnectorOptions o, std::optional<ConnectorOptions> producer = std::nullopt) {
  Two t;
  t.p = MakeWorker("shm", "prefill", Identity(0, 1), TensorOrder::kKvFirst, producer.value_or(o));
  t.d = MakeWorker("shm", "decode", Identity(0, 1), TensorOrder::kKvFirst, o);
  EXPECT_TRUE(t.p && t.d);
  Introduce({t.p.get(), t.d.get()});
  return t;
}

ConnectorOptions Quick() {
  ConnectorOptions o;
  o.deferred_write_timeout = 300ms;
  o.transfer_timeout = 300ms;
  o.abort_timeout = 600ms;
  return o;
}

auto DropType(MsgType type) {
  return [type](const Message& m) { return m.type == type; };
}

void SaveAll(Worker& p, const std::string& id, const std::vector<uint64_t>& blocks) {
  for (uint32_t l = 0; l < 3; ++l) {
    Fill(p, 1, l, blocks, 16 * blocks.size());
    ASSERT_TRUE(p.conn->SaveLayer(id, l, blocks).ok());
  }
  ASSERT_TRUE(p.conn->Seal(id, 3).ok());
}

// Exactly one end of `id` on `w`, within `within`, and nothing more after it.
Finished OneEnd(Worker& w, const std::string& id, std::chrono::milliseconds within = 5s) {
  auto f = Collect(w, 1, within);
  EXPECT_EQ(f.size(), 1u) << w.conn->id().ToString() << " did not end " << id;
  if (f.empty()) return {};
  EXPECT_EQ(f[0].request, id);
  EXPECT_TRUE(Collect(w, 1, 200ms).empty()) << id << " ended twice on " << w.conn->id().ToString();
  EXPECT_EQ(w.conn->pending(), 0u);
  return f[0];
}

TEST(ConnectorFaultTest, ADroppedAllocationEndsBothSides) {
  ConnectorOptions consumer = Quick();
  consumer.transfer_timeout = 1s;  // the producer's deferred-write timeout comes first
  Two t = MakeTwo(consumer, Quick());
  ConnectorAccess::DropOnArrival(*t.p->conn, DropType(MsgType::kAllocation));
  ASSERT_TRUE(t.d->conn->ExpectWrite("a", "prefill", 0, Blocks({4})).ok());
  SaveAll(*t.p, "a", Blocks({1}));
  Finished p = OneEnd(*t.p, "a");
  EXPECT_EQ(p.outcome, Outcome::kFailed);
  EXPECT_EQ(p.status.code(), Code::kDeadlineExceeded) << p.status.ToString();
  Finished d = OneEnd(*t.d, "a");
  EXPECT_NE(d.outcome, Outcome::kDone);
  EXPECT_EQ(d.blocks, Blocks({4}));
}

TEST(ConnectorFaultTest, ADroppedCompletionFailsTheConsumerForRecompute) {
  Two t = MakeTwo(Quick());
  ConnectorAccess::DropOnArrival(*t.d->conn, DropType(MsgType::kCompletion));
  ASSERT_TRUE(t.d->conn->ExpectWrite("c", "prefill", 0, Blocks({4, 5})).ok());
  SaveAll(*t.p, "c", Blocks({1, 2}));
  Finished p = OneEnd(*t.p, "c");
  EXPECT_EQ(p.outcome, Outcome::kDone);  // its writes all landed
  Finished d = OneEnd(*t.d, "c");
  EXPECT_EQ(d.outcome, Outcome::kFailed);
  EXPECT_EQ(d.status.code(), Code::kDeadlineExceeded) << d.status.ToString();
  EXPECT_EQ(d.blocks, Blocks({4, 5}));
}

TEST(ConnectorFaultTest, ADroppedAbortConfirmationHoldsTheBlocksUntilTheAbortTimeout) {
  ConnectorOptions producer = Quick();
  producer.abort_timeout = 10s;  // remembers the abort past the consumer's wait
  Two t = MakeTwo(Quick(), producer);
  ConnectorAccess::DropOnArrival(*t.d->conn, DropType(MsgType::kAbortAck));
  ASSERT_TRUE(t.d->conn->ExpectWrite("k", "prefill", 0, Blocks({4})).ok());
  std::this_thread::sleep_for(30ms);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(t.d->conn->Abort("k").ok());
  Finished d = OneEnd(*t.d, "k");
  EXPECT_EQ(d.outcome, Outcome::kAborted);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 500ms);  // held, not handed back at once
  EXPECT_EQ(t.d->conn->stats().blocks_expired, 1u);
  // The producer heard the abort: its request ended (aborted) and was reported, and its late
  // saves and seal are refused.
  Finished p = OneEnd(*t.p, "k");
  EXPECT_EQ(p.outcome, Outcome::kAborted);
  EXPECT_EQ(t.p->conn->SaveLayer("k", 0, Blocks({1})).code(), Code::kFailedPrecondition);
  EXPECT_EQ(t.p->conn->Seal("k", 3).code(), Code::kFailedPrecondition);
  EXPECT_EQ(t.p->conn->pending(), 0u);
}

TEST(ConnectorFaultTest, ADroppedReleaseHoldsTheProducerBlocksUntilTheAbortTimeout) {
  ConnectorOptions o = Quick();
  o.mode = Mode::kRead;
  Two t = MakeTwo(o);
  ConnectorAccess::DropOnArrival(*t.p->conn, DropType(MsgType::kRelease));
  for (uint32_t l = 0; l < 3; ++l) Fill(*t.p, 1, l, Blocks({2}), 16);
  auto params = t.p->conn->HoldForRead("r", Blocks({2}));
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE(t.d->conn->StartRead(*params, Blocks({7})).ok());
  // Every byte was read, but with its release unanswered the consumer cannot know that the
  // blocks were still held while it read: failed, for recompute.
  Finished d = OneEnd(*t.d, "r");
  EXPECT_EQ(d.outcome, Outcome::kFailed);
  EXPECT_EQ(d.status.code(), Code::kDeadlineExceeded) << d.status.ToString();
  EXPECT_EQ(d.blocks, Blocks({7}));
  for (uint32_t l = 0; l < 3; ++l) EXPECT_EQ(Check(*t.d, 1, l, Blocks({7}), 16), 0u);
  Finished p = OneEnd(*t.p, "r");
  EXPECT_EQ(p.outcome, Outcome::kFailed);
  EXPECT_EQ(p.status.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(t.p->conn->stats().blocks_expired, 1u);
}

TEST(ConnectorFaultTest, AReadAfterTheProducersHoldEndedIsNotTakenForDone) {
  ConnectorOptions o = Quick();
  o.mode = Mode::kRead;
  ConnectorOptions producer = o;
  producer.abort_timeout = 100ms;
  Two t = MakeTwo(o, producer);
  for (uint32_t l = 0; l < 3; ++l) Fill(*t.p, 1, l, Blocks({2}), 16);
  auto params = t.p->conn->HoldForRead("late", Blocks({2}));
  ASSERT_TRUE(params.ok());
  // The hold ends at the producer's abort timeout, and its blocks are the producer's again
  // (here reused for other data) before the consumer starts reading.
  Finished p = OneEnd(*t.p, "late");
  EXPECT_EQ(p.outcome, Outcome::kFailed);
  EXPECT_EQ(t.p->conn->stats().blocks_expired, 1u);
  for (uint32_t l = 0; l < 3; ++l) Fill(*t.p, 99, l, Blocks({2}), 16);
  ASSERT_TRUE(t.d->conn->StartRead(*params, Blocks({7})).ok());
  Finished d = OneEnd(*t.d, "late");
  EXPECT_EQ(d.outcome, Outcome::kFailed) << "stale blocks were read and reported done";
  EXPECT_EQ(d.status.code(), Code::kDeadlineExceeded) << d.status.ToString();
  EXPECT_NE(d.status.message().find("not held"), std::string_view::npos) << d.status.ToString();
  EXPECT_EQ(d.blocks, Blocks({7}));
}

TEST(ConnectorFaultTest, AConsumerThatDiesInReadModeFreesTheProducerWithoutWaitingForTheAbortTimeout) {
  ConnectorOptions o = Quick();
  o.mode = Mode::kRead;
  o.abort_timeout = 60s;
  o.liveness_interval = 50ms;
  Two t = MakeTwo(o);
  // The consumer announces its read, then is gone before releasing.
  ConnectorAccess::DropOnArrival(*t.p->conn, DropType(MsgType::kRelease));
  auto params = t.p->conn->HoldForRead("x", Blocks({2}));
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE(t.d->conn->StartRead(*params, Blocks({7})).ok());
  EXPECT_EQ(OneEnd(*t.d, "x").outcome, Outcome::kFailed);  // its release was never confirmed
  t.d.reset();
  Finished p = OneEnd(*t.p, "x", 10s);
  EXPECT_EQ(p.outcome, Outcome::kFailed);
  EXPECT_EQ(p.status.code(), Code::kUnavailable) << p.status.ToString();
}

TEST(ConnectorFaultTest, AbortsAtEveryStepEndEverythingOnceWithNoLateWrite) {
  // The consumer aborts after 0, 1, 2 or 3 of the producer's saves (3 = after the seal);
  // after its end the consumer's blocks are overwritten and must stay so.
  for (int at = 0; at <= 4; ++at) {
    SCOPED_TRACE("abort after step " + std::to_string(at));
    Two t = MakeTwo(Quick());
    const std::string id = "s" + std::to_string(at);
    ASSERT_TRUE(t.d->conn->ExpectWrite(id, "prefill", 0, Blocks({9, 10})).ok());
    bool aborted = false;
    for (int step = 0; step <= 4; ++step) {
      if (step == at) {
        ASSERT_TRUE(t.d->conn->Abort(id).ok() || at == 4);
        aborted = true;
      }
      if (step < 3) {
        Fill(*t.p, 1, step, Blocks({1, 2}), 32);
        ASSERT_TRUE(t.p->conn->SaveLayer(id, step, Blocks({1, 2})).ok());
      } else if (step == 3) {
        ASSERT_TRUE(t.p->conn->Seal(id, 3).ok());
      }
    }
    ASSERT_TRUE(aborted);
    Finished d = OneEnd(*t.d, id);
    for (const auto& b : t.d->buffers) std::memset(b.data(), 0x33, b.size());
    Finished p = OneEnd(*t.p, id);
    std::this_thread::sleep_for(50ms);
    for (const auto& b : t.d->buffers) {
      for (uint64_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], std::byte{0x33}) << "byte " << i;
    }
    if (d.outcome == Outcome::kDone) EXPECT_EQ(p.outcome, Outcome::kDone);
  }
}

}  // namespace
}  // namespace ferry::kv::testing
