// Multi-process tests of the shm transport against ferry_test_peer children: transfers with
// verification, the fallback to ucx for memory that is not shareable, peers (targets and
// initiators) that die or stop, revocation on deregistration, one-way notifications to a
// stopped or killed receiver. Hostile peers: shm_hostile_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "base/tsan.h"
#include "testing/shm_peer.h"

namespace ferry {
namespace {

using namespace shm_testing;  // NOLINT: test helpers

TEST(ShmProcess, WritesReadsAndNotifiesAcrossProcesses) {
  const size_t kBytes = 16 << 20;
  auto peer = PeerProcess::Start(kBytes, kSharedTarget);
  ASSERT_TRUE(peer);
  ASSERT_NE(peer->memory.FindAccess("shm"), nullptr);
  auto l = MakeLocal(kBytes, /*shared=*/false);  // only the target's memory must be shareable
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  auto s = l->engine->OpenSession(l->desc, peer->memory);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->path().transport, "shm");

  const size_t kBlock = 32 << 10, kBlocks = kBytes / kBlock;
  std::vector<TransferOp> ops;
  for (size_t b = 0; b < kBlocks; b += 2) ops.push_back({b * kBlock, (kBlocks - 1 - b) * kBlock, kBlock});
  TransferOptions options;
  options.notification = "req-7 done";
  Transfer t = s->WriteBatch(ops, options);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(t.path().transport, "shm");
  for (size_t i = 0; i < ops.size(); i += 97)
    EXPECT_EQ(peer->Command(HashCmd(ops[i].remote_offset, kBlock)), HashOf(l->data() + ops[i].local_offset, kBlock));
  EXPECT_EQ(peer->Command("notes"), "NOTES 1 req-7 done");

  // Large enough to be split over the copy threads.
  ASSERT_EQ(peer->Command("fill 9"), "OK");
  ASSERT_TRUE(s->Read(0, 0, kBytes).Wait().ok());
  EXPECT_EQ(peer->Command(HashCmd(0, kBytes)), HashOf(l->data(), kBytes));
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "direct").ok());
  EXPECT_EQ(WaitNotes(*peer, "NOTES 2 direct"), "NOTES 2 direct");

  EXPECT_EQ(s->Write(0, kBytes - 1, 2).Wait().code(), Code::kOutOfRange);
  MemoryDesc lying = peer->memory;
  lying.size *= 2;
  EngineOptions only_shm;
  only_shm.transports = {"shm"};
  auto m = MakeLocal(4096, true, only_shm);
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->engine->AddPeer(peer->engine).ok());
  EXPECT_EQ(m->engine->OpenSession(m->desc, lying).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(m->engine->OpenSession(m->desc, peer->memory).ok());
}

TEST(ShmProcess, MemoryThatIsNotShareableGoesOverUcx) {
  auto heap_peer = PeerProcess::Start(1 << 20, kHeapTarget);
  auto shared_peer = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(heap_peer && shared_peer);
  EXPECT_EQ(heap_peer->memory.FindAccess("shm"), nullptr);
  EXPECT_NE(heap_peer->memory.FindAccess("ucx"), nullptr);
  for (bool shared_local : {false, true}) {
    auto l = MakeLocal(1 << 20, shared_local);
    ASSERT_TRUE(l);
    ASSERT_TRUE(l->engine->AddPeer(heap_peer->engine).ok());
    ASSERT_TRUE(l->engine->AddPeer(shared_peer->engine).ok());
    auto to_heap = l->engine->OpenSession(l->desc, heap_peer->memory);
    auto to_shared = l->engine->OpenSession(l->desc, shared_peer->memory);
    ASSERT_TRUE(to_heap.ok() && to_shared.ok());
    Transfer a = to_heap->Write(0, 0, 1 << 20);
    Transfer b = to_shared->Write(0, 0, 1 << 20);
    ASSERT_TRUE(a.Wait().ok() && b.Wait().ok());
    EXPECT_EQ(a.path().transport, "ucx");
    EXPECT_EQ(b.path().transport, "shm");
    EXPECT_EQ(heap_peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
    EXPECT_EQ(shared_peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
  }
}

TEST(ShmProcess, KilledTargetEndsEveryTransferAndOthersGoOn) {
  // 64 batches of 64 KiB blocks (runs the engine merges), in flight on two copy threads when
  // the target dies. Each batch writes the whole 64 MiB region; under TSan, batches writing the
  // same bytes from two threads are racing writes that it checks one by one, slowly enough to
  // stall the test, so there each batch writes 4 MiB of a slice of its own (TSan copies slowly
  // enough that batches are still in flight when the peer dies).
#ifdef FERRY_TSAN
  constexpr bool kOwnSlices = true;
#else
  constexpr bool kOwnSlices = false;
#endif
  const size_t kBatches = 64, kBatchBytes = kOwnSlices ? 4 << 20 : 64 << 20;
  const size_t kBytes = kOwnSlices ? kBatches * kBatchBytes : kBatchBytes;
  auto victim = PeerProcess::Start(kBytes, kSharedTarget);
  auto bystander = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(victim && bystander);
  EngineOptions options;
  options.copy_threads = 2;
  options.parallel_copy_bytes = 1 << 20;
  auto l = MakeLocal(kBatchBytes, false, options);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(victim->engine).ok());
  ASSERT_TRUE(l->engine->AddPeer(bystander->engine).ok());
  auto to_victim = l->engine->OpenSession(l->desc, victim->memory);
  ASSERT_TRUE(to_victim.ok());
  ASSERT_EQ(to_victim->path().transport, "shm");
  TransferOptions deadline;
  deadline.deadline = std::chrono::seconds(20);
  std::vector<Transfer> transfers;
  for (size_t b = 0; b < kBatches; ++b) {
    const uint64_t slice = kOwnSlices ? b * kBatchBytes : 0;
    std::vector<TransferOp> ops;
    for (uint64_t off = 0; off < kBatchBytes; off += 64 << 10) ops.push_back({off, slice + off, 64 << 10});
    transfers.push_back(to_victim->WriteBatch(ops, deadline));
  }
  ASSERT_TRUE(transfers[0].Wait().ok());
  victim->Kill(SIGKILL);
  auto start = Clock::now();
  int failed = 0;
  for (auto& t : transfers) {
    Status s = t.Wait();
    EXPECT_TRUE(s.ok() || s.code() == Code::kUnavailable) << s.ToString();
    failed += !s.ok();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_GT(failed, 0) << "every batch finished before the peer died; the test proves nothing";
  Status after = to_victim->Write(0, 0, 4096).Wait();
  EXPECT_EQ(after.code(), Code::kUnavailable) << after.ToString();

  auto to_bystander = l->engine->OpenSession(l->desc, bystander->memory);
  ASSERT_TRUE(to_bystander.ok());
  ASSERT_TRUE(to_bystander->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(bystander->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));

  // The peer restarts under the same key with a new descriptor: AddPeer reconnects.
  std::vector<std::string> args = kSharedTarget;
  args.insert(args.end(), {"--key", victim->engine.key});
  auto reborn = PeerProcess::Start(1 << 20, args);
  ASSERT_TRUE(reborn);
  EXPECT_EQ(reborn->engine.key, victim->engine.key);
  EXPECT_NE(reborn->engine.pid, victim->engine.pid);
  ASSERT_TRUE(l->engine->AddPeer(reborn->engine).ok());
  auto again = l->engine->OpenSession(l->desc, reborn->memory);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->path().transport, "shm");
  ASSERT_TRUE(again->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(reborn->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
}

TEST(ShmProcess, StoppedTargetTakesWritesButNotificationsHitTheDeadline) {
  auto peer = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(peer);
  auto l = MakeLocal(1 << 20, false);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  auto s = l->engine->OpenSession(l->desc, peer->memory);
  ASSERT_TRUE(s.ok());
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  // The copy needs no help from the target's threads.
  EXPECT_TRUE(s->Write(0, 0, 1 << 20).Wait().ok());
  TransferOptions options;
  options.deadline = std::chrono::milliseconds(500);
  options.notification = "never read";
  auto start = Clock::now();
  Status st = s->Write(0, 0, 4096, options).Wait();
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  peer->Signal(SIGCONT);
  EXPECT_EQ(peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
}

// Notifications are one-way: a receiver that does not drain (stopped) fills its ring, and the
// sender hears of it; once it runs again it has every notification the sender was told went.
TEST(ShmProcess, StoppedReceiverFillsItsRingAndTheSenderHearsOfIt) {
  auto peer = PeerProcess::Start(4096, kSharedTarget);
  ASSERT_TRUE(peer);
  auto l = ShmOnlyTo(*peer);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "first").ok());
  EXPECT_EQ(WaitNotes(*peer, "NOTES 1 first"), "NOTES 1 first");
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  const std::string big(60000, 'b');
  int sent = 0;
  Status s;
  while (sent < 1000 && (s = l->engine->Notify(peer->engine.key, big)).ok()) ++sent;
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, 1000);
  peer->Signal(SIGCONT);
  const std::string all = "NOTES " + std::to_string(1 + sent) + " " + big;
  EXPECT_EQ(WaitNotes(*peer, all), all);
  // Room again.
  EXPECT_TRUE(l->engine->Notify(peer->engine.key, "after").ok());
  EXPECT_EQ(peer->Command("stats"), "STATS 0 0");
}

// A receiver that was killed: notifications to it fail with kUnavailable soon after.
TEST(ShmProcess, NotificationsToAKilledReceiverFail) {
  auto peer = PeerProcess::Start(4096, kSharedTarget);
  ASSERT_TRUE(peer);
  auto l = ShmOnlyTo(*peer);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "alive").ok());
  peer->Kill(SIGKILL);
  auto start = Clock::now();
  Status s;
  while ((s = l->engine->Notify(peer->engine.key, "dead?")).ok() && Clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(l->engine->Notify(peer->engine.key, "again").code(), Code::kUnavailable);
}

TEST(ShmProcess, DeregistrationRevokesThePeersMapping) {
  auto l = MakeLocal(1 << 20, true);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE OK");
  EXPECT_EQ(peer->Command(HashCmd(0, 65536)), HashOf(l->data(), 65536));
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << "the peer acknowledged at once";
  // The peer stopped using the region: nothing more lands in it.
  std::memset(l->data(), 0, 65536);
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE FAILED_PRECONDITION");
  EXPECT_EQ(l->data()[0], 0);
  EXPECT_EQ(peer->Command("open " + Hex(l->desc.Pack())), "ERR FAILED_PRECONDITION");
  // Registered again, the same memory is reachable again.
  auto again = l->engine->RegisterMemory(l->data(), 1 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(peer->Command("open " + Hex(again->Pack())), "SESSION shm");
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE OK");
  EXPECT_EQ(peer->Command(HashCmd(0, 65536)), HashOf(l->data(), 65536));
}

TEST(ShmProcess, StoppedInitiatorDoesNotHoldDeregistrationPastItsDeadline) {
  EngineOptions options;
  options.shm.revoke_timeout = std::chrono::milliseconds(500);
  auto l = MakeLocal(1 << 20, true, options);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->Command("write 0 0 4096"), "DONE OK");
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(400)) << "it waited for the peer's answer";
  EXPECT_LT(took, std::chrono::seconds(2));
  peer->Signal(SIGCONT);
  // The peer was disconnected (or saw the revocation first): its transfers fail.
  std::string after = peer->Command("write 0 0 4096");
  EXPECT_TRUE(after == "DONE UNAVAILABLE" || after == "DONE FAILED_PRECONDITION") << after;
}

TEST(ShmProcess, KilledInitiatorIsDropped) {
  auto l = MakeLocal(1 << 20, true);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  ASSERT_EQ(peer->Command("write 0 0 1048576"), "DONE OK");
  // Writes in a loop, killed while they run.
  peer->Post("writes 1000000 1048576");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  peer->Kill(SIGKILL);
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  // This engine keeps serving others.
  auto again = l->engine->RegisterMemory(l->data(), 1 << 20);
  ASSERT_TRUE(again.ok());
  l->desc = *again;
  auto next = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->Command("write 0 0 4096"), "DONE OK");
  EXPECT_EQ(next->Command(HashCmd(0, 4096)), HashOf(l->data(), 4096));
}

}  // namespace
}  // namespace ferry
