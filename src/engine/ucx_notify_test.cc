// Notifications over `ucx` when application threads drive the UCX worker (Engine::Notify
// sends from the calling thread when it can take the worker; PopNotifications progresses it):
// several sending threads while batches are in flight, every notification after its data and
// in each thread's order, for each progress mode; a killed peer still fails Notify and
// transfers within their deadlines while the application polls.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/peer_process.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* ModeName(UcxOptions::Progress p) {
  switch (p) {
    case UcxOptions::Progress::kPolling:
      return "poll";
    case UcxOptions::Progress::kEvent:
      return "event";
    case UcxOptions::Progress::kShared:
      return "shared";
  }
  return "?";
}

struct Side {
  std::vector<uint8_t> buf;  // first: destroyed after the engine
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
};

Side MakeSide(const std::string& key, size_t bytes, UcxOptions::Progress mode) {
  Side s;
  EngineOptions options;
  options.key = key;
  options.transports = {"ucx"};
  options.ucx.progress = mode;
  options.ucx.listen_host = "127.0.0.1";
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return s;
  s.engine = std::move(e).value();
  s.buf.assign(bytes, 0);
  auto d = s.engine->RegisterMemory(s.buf.data(), bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (d.ok()) s.desc = *d;
  return s;
}

class UcxNotify : public ::testing::TestWithParam<UcxOptions::Progress> {};

// Each sender thread owns a slot of the receiver's buffer: each round it writes the round's
// number to the round's place in the slot, waits for the write, then notifies (Engine::Notify,
// or the write's own notification every third round). The receiver, polling on this thread,
// must see every notification exactly once, in each sender's order, with its data already in
// place, while a bulk thread keeps 8 MiB batches in flight on the same connection.
TEST_P(UcxNotify, ConcurrentSendersEachInOrderAfterTheirData) {
  constexpr int kSenders = 4;
  constexpr uint64_t kRounds = 150;  // kRounds * 8 bytes fit a slot
  constexpr size_t kSlot = 4096;
  constexpr size_t kBulk = 8 << 20;
  const size_t bytes = kSenders * kSlot + kBulk;
  Side a = MakeSide("sender", bytes, GetParam());
  Side b = MakeSide("receiver", bytes, GetParam());
  ASSERT_TRUE(a.engine && b.engine);
  ASSERT_TRUE(a.engine->AddPeer(b.engine->Describe()).ok());
  auto session = a.engine->OpenSession(a.desc, b.desc);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_EQ(session->path().transport, "ucx");
  // The first notification on a connection is a round trip; later ones are one-way.
  ASSERT_TRUE(a.engine->Notify("receiver", "hello").ok());

  std::atomic<bool> stop_bulk{false};
  std::atomic<int> bulk_batches{0};
  std::thread bulk([&] {
    std::vector<TransferOp> ops;
    for (uint64_t off = 0; off < kBulk; off += 64 << 10)
      ops.push_back({kSenders * kSlot + off, kSenders * kSlot + off, 64 << 10});
    while (!stop_bulk.load()) {
      Status s = session->WriteBatch(ops).Wait();
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) return;
      bulk_batches.fetch_add(1);
    }
  });
  std::atomic<int> failures{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < kSenders; ++t) {
    senders.emplace_back([&, t] {
      for (uint64_t round = 1; round <= kRounds; ++round) {
        // Each round its own 8 bytes of the thread's slot: no byte is written twice.
        const uint64_t at = t * kSlot + round * sizeof(round);
        std::memcpy(a.buf.data() + at, &round, sizeof(round));
        std::string message = std::to_string(t) + " " + std::to_string(round);
        TransferOptions options;
        if (round % 3 == 0) options.notification = message;
        Status s = session->Write(at, at, sizeof(round), options).Wait();
        if (s.ok() && round % 3 != 0) s = a.engine->Notify("receiver", message);
        if (!s.ok()) {
          ADD_FAILURE() << "sender " << t << " round " << round << ": " << s.ToString();
          failures.fetch_add(1);
          return;
        }
      }
    });
  }

  std::map<int, uint64_t> last;  // sender -> last round seen
  uint64_t received = 0;
  bool hello = false;
  auto until = Clock::now() + 60s;
  while (received < kSenders * kRounds && failures.load() == 0 && Clock::now() < until) {
    for (const Notification& n : b.engine->PopNotifications()) {
      ASSERT_EQ(n.from, "sender");
      if (n.message == "hello") {
        hello = true;
        continue;
      }
      int t = -1;
      unsigned long long round = 0;
      ASSERT_EQ(std::sscanf(n.message.c_str(), "%d %llu", &t, &round), 2) << n.message;
      ASSERT_TRUE(t >= 0 && t < kSenders) << n.message;
      EXPECT_EQ(round, last[t] + 1) << "sender " << t << ": out of order or lost";
      last[t] = round;
      uint64_t landed = 0;
      std::memcpy(&landed, b.buf.data() + t * kSlot + round * sizeof(landed), sizeof(landed));
      EXPECT_EQ(landed, round) << "notification '" << n.message << "' arrived before its data";
      ++received;
    }
    std::this_thread::yield();
  }
  for (auto& s : senders) s.join();
  stop_bulk.store(true);
  bulk.join();
  EXPECT_TRUE(hello);
  EXPECT_EQ(received, kSenders * kRounds);
  for (int t = 0; t < kSenders; ++t) EXPECT_EQ(last[t], kRounds) << "sender " << t;
  EXPECT_GT(bulk_batches.load(), 0);
  EXPECT_EQ(b.engine->stats().dropped_notifications, 0u);
}

// Nobody polls the receiver: its progress thread alone delivers (every mode).
TEST_P(UcxNotify, DeliveredWithoutAnApplicationThreadPolling) {
  Side a = MakeSide("sender", 4096, GetParam());
  Side b = MakeSide("receiver", 4096, GetParam());
  ASSERT_TRUE(a.engine && b.engine);
  ASSERT_TRUE(a.engine->AddPeer(b.engine->Describe()).ok());
  for (int i = 0; i < 50; ++i)
    ASSERT_TRUE(a.engine->Notify("receiver", "n" + std::to_string(i)).ok());
  // Sleep rather than poll: on an empty inbox PopNotifications progresses the worker itself,
  // on a non-empty one it only takes what is there.
  std::this_thread::sleep_for(500ms);
  std::vector<Notification> got = b.engine->PopNotifications();
  EXPECT_FALSE(got.empty()) << "nothing was delivered while no application thread polled";
  auto until = Clock::now() + 10s;
  while (got.size() < 50 && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    for (auto& n : b.engine->PopNotifications()) got.push_back(std::move(n));
  }
  ASSERT_EQ(got.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(got[i].message, "n" + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Progress, UcxNotify,
                         ::testing::Values(UcxOptions::Progress::kEvent,
                                           UcxOptions::Progress::kShared,
                                           UcxOptions::Progress::kPolling),
                         [](const auto& info) { return std::string(ModeName(info.param)); });

// A peer killed while this engine's application thread polls (kShared: that thread drives the
// worker): Notify fails with kUnavailable within the connect timeout and no call hangs;
// transfers to it fail within their deadline.
TEST(UcxNotifyKill, KilledPeerFailsNotifyAndTransfersWhileTheApplicationPolls) {
  auto peer = testing::PeerProcess::Start(1 << 20);
  ASSERT_TRUE(peer);
  Side l = MakeSide("local", 1 << 20, UcxOptions::Progress::kShared);
  ASSERT_TRUE(l.engine);
  ASSERT_TRUE(l.engine->AddPeer(peer->engine).ok());
  auto session = l.engine->OpenSession(l.desc, peer->memory);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_TRUE(l.engine->Notify(peer->engine.key, "hello").ok());
  ASSERT_TRUE(session->Write(0, 0, 4096).Wait().ok());

  std::atomic<bool> polling{true};
  std::thread poller([&] {
    while (polling.load()) {
      (void)l.engine->PopNotifications();
      std::this_thread::yield();
    }
  });
  peer->Kill(SIGKILL);
  auto start = Clock::now();
  Status s;
  while (s.ok() && Clock::now() - start < 15s) {
    auto call = Clock::now();
    s = l.engine->Notify(peer->engine.key, "anyone?");
    EXPECT_LT(Clock::now() - call, 11s);  // UcxOptions::connect_timeout bounds every call
    if (s.ok()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  TransferOptions options;
  options.deadline = 3s;
  auto t0 = Clock::now();
  Status w = session->Write(0, 0, 4096, options).Wait();
  EXPECT_TRUE(w.code() == Code::kUnavailable || w.code() == Code::kDeadlineExceeded)
      << w.ToString();
  EXPECT_LT(Clock::now() - t0, 5s);
  polling.store(false);
  poller.join();
}

}  // namespace
}  // namespace ferry
