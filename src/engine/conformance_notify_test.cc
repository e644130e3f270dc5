// The transport conformance suite, notifications and concurrency: notifications after their
// data and in order, a full inbox, many threads and sessions, transfer ids, sessions that
// outlive their engine. Fixture and parameters: testing/conformance.h, conformance_test.cc.
#include "testing/conformance.h"

namespace ferry::conformance {
namespace {

TEST_P(Conformance, NotificationFollowsItsData) {
  auto p = FilledPair(9, 1 << 20);
  ASSERT_TRUE(p);
  auto ops = ScatteredOps(1 << 20, 256, 2048, 10);
  TransferOptions options;
  options.notification = "layer-31-done";
  ASSERT_TRUE(p->session.WriteBatch(ops, options).Wait().ok());
  auto got = p->b->PopNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].from, p->a->key());
  EXPECT_EQ(got[0].message, "layer-31-done");
  ExpectApplied(p->a_buf, p->b_buf, ops, true);
  EXPECT_TRUE(p->b->PopNotifications().empty());

  // An empty batch may carry a notification too.
  options.notification = "empty";
  ASSERT_TRUE(p->session.WriteBatch({}, options).Wait().ok());
  EXPECT_EQ(p->b->PopNotifications().at(0).message, "empty");
  // Reads carry none.
  EXPECT_EQ(p->session.Read(0, 0, 8, options).Wait().code(), Code::kInvalidArgument);
  // A failed batch sends none.
  EXPECT_EQ(p->session.Write(0, 1 << 20, 8, options).Wait().code(), Code::kOutOfRange);
  EXPECT_TRUE(p->b->PopNotifications().empty());
}

TEST_P(Conformance, DirectNotificationsArriveInOrder) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(p->a->Notify(p->b->key(), "note " + std::to_string(i)).ok());
  std::string binary("\x00\xff\x00", 3);
  ASSERT_TRUE(p->b->Notify(p->a->key(), binary).ok());
  auto got = WaitNotifications(*p->b, 100);
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i].message, "note " + std::to_string(i));
  EXPECT_EQ(got[0].from, p->a->key());
  auto back = WaitNotifications(*p->a, 1);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].message, binary);
  EXPECT_TRUE(p->b->PopNotifications().empty());
  EXPECT_EQ(p->a->Notify("nobody", "x").code(), Code::kFailedPrecondition);
  EXPECT_EQ(p->a->Notify(p->b->key(), std::string(64 * 1024 + 1, 'x')).code(), Code::kInvalidArgument);
}

// Notifications sent after a batch completed, and with batches, arrive after that batch's
// data and in the order they were sent.
TEST_P(Conformance, NotificationsKeepTheirOrderAfterTheData) {
  const size_t kBytes = 1 << 20, kRounds = 32;
  auto p = FilledPair(21, kBytes);
  ASSERT_TRUE(p);
  const uint64_t slice = kBytes / kRounds;
  for (size_t r = 0; r < kRounds; ++r) {
    std::vector<TransferOp> ops;
    for (uint64_t off = 0; off < slice; off += 4096) ops.push_back({r * slice + off, r * slice + off, 4096});
    TransferOptions options;
    if (r % 2 == 0) options.notification = "batch " + std::to_string(r);
    ASSERT_TRUE(p->session.WriteBatch(ops, options).Wait().ok());
    ASSERT_TRUE(p->a->Notify(p->b->key(), "after " + std::to_string(r)).ok());
  }
  auto got = WaitNotifications(*p->b, kRounds + kRounds / 2);
  ASSERT_EQ(got.size(), kRounds + kRounds / 2);
  size_t i = 0;
  for (size_t r = 0; r < kRounds; ++r) {
    if (r % 2 == 0) {
      EXPECT_EQ(got[i++].message, "batch " + std::to_string(r));
    }
    EXPECT_EQ(got[i++].message, "after " + std::to_string(r));
  }
  EXPECT_EQ(std::memcmp(p->a_buf.data(), p->b_buf.data(), kBytes), 0);
}

// A full inbox refuses: the sender hears of it where the notification waits for the receiver
// (a batch's notification, and Notify within a process); a one-way Notify is dropped at the
// receiver. Either way the receiver counts every refusal.
TEST_P(Conformance, FullInboxPushesBack) {
  EngineOptions options;
  options.max_pending_notifications = 4;
  auto p = Pair(4096, options);
  ASSERT_TRUE(p);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p->a->Notify(p->b->key(), "x").ok());
  Status fifth = p->a->Notify(p->b->key(), "x");
  EXPECT_TRUE(fifth.ok() || fifth.code() == Code::kResourceExhausted) << fifth.ToString();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (p->b->stats().dropped_notifications < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(p->b->stats().dropped_notifications, 1u);
  TransferOptions with_note;
  with_note.notification = "batch";
  EXPECT_EQ(p->session.Write(0, 0, 8, with_note).Wait().code(), Code::kResourceExhausted);
  EXPECT_EQ(p->b->stats().dropped_notifications, 2u);
  EXPECT_EQ(p->b->PopNotifications().size(), 4u);
  EXPECT_EQ(p->a->stats().dropped_notifications, 0u);
  EXPECT_TRUE(p->a->Notify(p->b->key(), "y").ok());
  auto got = WaitNotifications(*p->b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "y");
}

TEST_P(Conformance, ManyThreadsManySessions) {
  const size_t kThreads = 8, kSlice = 256 << 10;
  EngineOptions options;
  options.copy_threads = 2;
  options.parallel_copy_bytes = 64 << 10;
  auto p = FilledPair(11, kThreads * kSlice, options);
  ASSERT_TRUE(p);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = p->a->OpenSession(p->a_desc, p->b_desc);
      if (!s.ok()) {
        failures++;
        return;
      }
      for (int round = 0; round < 20; ++round) {
        std::vector<TransferOp> ops;
        for (uint64_t off = 0; off < kSlice; off += 4096) {
          uint64_t base = t * kSlice;
          ops.push_back({base + off, base + (kSlice - 4096 - off), 4096});
        }
        if (!s->WriteBatch(ops).Wait().ok()) failures++;
        if (!s->Write(t * kSlice, t * kSlice + kSlice - 4096, 1).Wait().ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (size_t t = 0; t < kThreads; ++t) {
    for (uint64_t off = 0; off < kSlice; off += 4096) {
      uint64_t base = t * kSlice;
      ASSERT_EQ(std::memcmp(p->a_buf.data() + base + off,
                            p->b_buf.data() + base + (kSlice - 4096 - off), 4096), 0);
    }
  }
}

TEST_P(Conformance, TransferIdsAreUniqueOrGiven) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  Transfer x = p->session.Write(0, 0, 8);
  Transfer y = p->session.Write(0, 0, 8);
  EXPECT_NE(static_cast<uint64_t>(x.id()), static_cast<uint64_t>(y.id()));
  TransferOptions options;
  options.id = p->a->AllocateTransferId();
  Transfer z = p->session.Write(0, 0, 8, options);
  EXPECT_EQ(z.id(), *options.id);
  EXPECT_TRUE(x.Wait().ok() && y.Wait().ok() && z.Wait().ok());
}

TEST_P(Conformance, SessionsFailCleanlyAfterTheirEngineIsGone) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  Session s = p->session;
  p->a.reset();
  EXPECT_EQ(s.Write(0, 0, 8).Wait().code(), Code::kAborted);
}

}  // namespace
}  // namespace ferry::conformance
