// One cross-process suite over every transport that reaches other processes (shm; ucx with
// one-sided RMA or active messages, on one worker or two; cuda_ipc with GPU memory on both
// sides), each against ferry_test_peer children: data both ways with notifications, a peer
// killed with batches in flight, notifications to a killed peer, a peer restarted under the
// same key, and a peer stopped (SIGSTOP); hostile initiators (forged descriptors, deregistered
// regions, notifications over the receiver's limits) are in process_hostile_test.cc, in the same
// binary. Where transports answer differently the expectation is a field of ProcessCase
// (testing/process_rig.h) that says why. Cases of one transport only stay in its own files
// (shm_process_test.cc, ucx_process_test.cc, cuda_process_test.cc, the *_hostile_test.cc).
//
// ctest runs the cuda_ipc instances of the kill and restart cases in a process of their own
// (process_conformance_kill_test): if a driver turned a dead peer's memory into a fault, this
// process's CUDA context would not be usable after.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "base/tsan.h"
#include "ferry/engine.h"
#include "testing/cuda_buffer.h"
#include "testing/process_rig.h"

namespace ferry {
namespace {

using namespace process_testing;  // NOLINT: test helpers
using namespace std::chrono_literals;

class ProcessConformance : public ::testing::TestWithParam<ProcessCase> {
 protected:
  void SetUp() override {
    if (GetParam().gpu) {
      FERRY_SKIP_WITHOUT_CUDA(1);
    }
  }
  const ProcessCase& c() const { return GetParam(); }
};

TEST_P(ProcessConformance, WritesReadsAndNotifiesAcrossProcesses) {
  const size_t kBytes = 16 << 20;
  auto r = MakeRig(c(), kBytes);
  ASSERT_TRUE(r);
  ASSERT_NE(r->peer->memory.FindAccess(c().transport), nullptr);
  PeerProcess& peer = *r->peer;

  // Scattered 32 KiB blocks, reversed on the far side, with a notification at the end.
  const size_t kBlock = 32 << 10, kBlocks = kBytes / kBlock;
  std::vector<TransferOp> ops;
  for (size_t b = 0; b < kBlocks; b += 2) ops.push_back({b * kBlock, (kBlocks - 1 - b) * kBlock, kBlock});
  TransferOptions options;
  options.notification = "req-7 done";
  Transfer t = r->session.WriteBatch(ops, options);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(t.path().transport, c().transport);
  for (size_t i = 0; i < ops.size(); i += 97)
    EXPECT_EQ(peer.Command(Rig::HashCmd(ops[i].remote_offset, kBlock)), r->HashOfLocal(ops[i].local_offset, kBlock));
  // The transfer completed: the receiver already holds the notification.
  EXPECT_EQ(peer.Command("notes"), "NOTES 1 req-7 done");

  // The whole far buffer read back after the peer refills it (large enough to be split over
  // copy threads where the transport has them).
  ASSERT_EQ(peer.Command("fill 9"), "OK");
  ASSERT_TRUE(r->session.Read(0, 0, kBytes).Wait().ok());
  EXPECT_EQ(peer.Command(Rig::HashCmd(0, kBytes)), r->HashOfLocal(0, kBytes));
  ASSERT_TRUE(r->engine->Notify(peer.engine.key, "direct").ok());
  EXPECT_EQ(WaitNotes(peer, "NOTES 2 direct"), "NOTES 2 direct");

  // Out of range fails cleanly across processes too (forged descriptors: process_hostile_test.cc).
  EXPECT_EQ(r->session.Write(0, kBytes - 1, 2).Wait().code(), Code::kOutOfRange);
}

// The batches of the killed-peer case: 64 KiB blocks over the region (at `slice` on the far
// side), or scattered small pieces.
std::vector<TransferOp> KillOps(const ProcessCase& c, uint64_t bytes, uint64_t slice) {
  if (c.kill_scattered) return cuda_testing::Scattered(bytes, 60000, 4000, 9);
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < bytes; off += 64 << 10) ops.push_back({off, slice + off, 64 << 10});
  return ops;
}

TEST_P(ProcessConformance, KilledPeerEndsEveryTransferAndOthersGoOn) {
  if (c().kill_skipped) {
    GTEST_SKIP() << "a killed peer with several UCX workers can abort in UCX 1.13 (UcxOptions::workers)";
  }
#ifdef FERRY_TSAN
  const bool own_slices = c().kill_own_slices_under_tsan;
#else
  const bool own_slices = false;
#endif
  const uint64_t batch_bytes = own_slices ? 4 << 20 : c().kill_region;
  const uint64_t peer_bytes = own_slices ? c().kill_batches * batch_bytes : batch_bytes;
  auto r = MakeRig(c(), batch_bytes, /*with_peer=*/false);
  ASSERT_TRUE(r);
  auto victim = StartPeer(c(), peer_bytes);
  auto bystander = StartPeer(c(), 1 << 20);
  ASSERT_TRUE(victim && bystander);
  ASSERT_TRUE(r->engine->AddPeer(victim->engine).ok());
  ASSERT_TRUE(r->engine->AddPeer(bystander->engine).ok());
  auto to_victim = r->engine->OpenSession(r->local, victim->memory);
  ASSERT_TRUE(to_victim.ok()) << to_victim.status().ToString();
  ASSERT_EQ(to_victim->path().transport, c().transport);
  TransferOptions options;
  options.deadline = c().kill_deadline;
  if (!c().kill_notification.empty()) options.notification = c().kill_notification;
  std::vector<Transfer> transfers;
  std::vector<TransferOp> first_ops;
  for (int b = 0; b < c().kill_batches; ++b) {
    auto ops = KillOps(c(), batch_bytes, own_slices ? b * batch_bytes : 0);
    if (b == 0) first_ops = ops;
    const bool read = c().kill_mixes_reads && b % 2 == 1;
    transfers.push_back(read ? to_victim->ReadBatch(ops, options) : to_victim->WriteBatch(ops, options));
  }
  if (c().kill_waits_for_first) {
    ASSERT_TRUE(transfers[0].Wait().ok());
  }
  victim->Kill(SIGKILL);
  auto start = Clock::now();
  int failed = 0;
  for (auto& t : transfers) {
    // The same cause, the same code, for reads and writes alike: the peer failed, well before
    // the transfers' deadline (cuda_ipc: or at it, see ProcessCase::killed_may_hit_deadline).
    Status s = t.WaitFor(30s);
    EXPECT_TRUE(s.ok() || s.code() == Code::kUnavailable ||
                (c().killed_may_hit_deadline && s.code() == Code::kDeadlineExceeded))
        << s.ToString();
    failed += !s.ok();
  }
  EXPECT_LT(Clock::now() - start, c().kill_bound);
  EXPECT_GT(failed, 0) << "every batch finished before the peer died; the test proves nothing";
  // New transfers to the dead peer fail at once or within their deadline.
  TransferOptions short_deadline;
  short_deadline.deadline = 3s;
  Status after = to_victim->WriteBatch(first_ops, short_deadline).Wait();
  EXPECT_EQ(after.code(), Code::kUnavailable) << after.ToString();
  if (c().kill_mixes_reads) {
    after = to_victim->Read(0, 0, 4096, short_deadline).Wait();
    EXPECT_EQ(after.code(), Code::kUnavailable) << after.ToString();
  }

  // The bystander is unaffected.
  auto to_bystander = r->engine->OpenSession(r->local, bystander->memory);
  ASSERT_TRUE(to_bystander.ok()) << to_bystander.status().ToString();
  ASSERT_TRUE(to_bystander->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(bystander->Command(Rig::HashCmd(0, 1 << 20)), r->HashOfLocal(0, 1 << 20));
  if (c().gpu) (void)bystander->Command("exit");
}

// A peer restarts under the same key with a new descriptor: once a transfer found the old one
// dead, AddPeer replaces it and sessions reach the new process.
TEST_P(ProcessConformance, RestartedPeerUnderTheSameKeyIsReachedAgain) {
  if (c().kill_skipped) {
    GTEST_SKIP() << "a killed peer with several UCX workers can abort in UCX 1.13 (UcxOptions::workers)";
  }
  auto r = MakeRig(c(), 1 << 20);
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->session.Write(0, 0, 1 << 20).Wait().ok());
  const EngineDesc old = r->peer->engine;
  r->peer->Kill(SIGKILL);
  TransferOptions short_deadline;
  short_deadline.deadline = 3s;
  // A one-sided write into memory still mapped here (shm) succeeds until the transport has seen
  // the connection close, which its I/O thread does a moment after the kill: within 5 s a write
  // must find the peer dead.
  Status dead;
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  do {
    dead = r->session.Write(0, 0, 4096, short_deadline).Wait();
    if (!dead.ok()) break;
    std::this_thread::sleep_for(10ms);
  } while (std::chrono::steady_clock::now() < give_up);
  EXPECT_EQ(dead.code(), Code::kUnavailable) << dead.ToString();

  auto reborn = StartPeer(c(), 1 << 20, {"--key", old.key});
  ASSERT_TRUE(reborn);
  EXPECT_EQ(reborn->engine.key, old.key);
  EXPECT_NE(reborn->engine.pid, old.pid);
  if (c().restart_changes_addresses) {
    EXPECT_NE(reborn->engine.addresses, old.addresses);
  }
  ASSERT_TRUE(r->engine->AddPeer(reborn->engine).ok());
  auto again = r->engine->OpenSession(r->local, reborn->memory);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->path().transport, c().transport);
  ASSERT_TRUE(again->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(reborn->Command(Rig::HashCmd(0, 1 << 20)), r->HashOfLocal(0, 1 << 20));
  r->peer = std::move(reborn);
}

// A peer that dies: a notification sent as it dies may vanish (Notify is one-way), but a later
// one fails with kUnavailable, within the transport's bound, and none hangs; so do the next.
TEST_P(ProcessConformance, NotificationsToAKilledPeerFail) {
  if (!c().carries_notifications) {
    GTEST_SKIP() << c().transport << " carries no notifications (its engines notify over ucx)";
  }
  if (c().kill_skipped) {
    GTEST_SKIP() << "a killed peer with several UCX workers can abort in UCX 1.13 (UcxOptions::workers)";
  }
  ProcessCase only = c();
  only.local_transports = {c().transport};
  auto r = MakeRig(only, 4096, /*with_peer=*/false, c().only_alloc);
  ASSERT_TRUE(r);
  r->peer = StartPeer(c(), 4096);
  ASSERT_TRUE(r->peer);
  PeerProcess& peer = *r->peer;
  ASSERT_TRUE(r->engine->AddPeer(peer.engine).ok());
  ASSERT_TRUE(r->engine->Notify(peer.engine.key, "hello").ok());
  ASSERT_TRUE(r->engine->Notify(peer.engine.key, "again").ok());
  EXPECT_EQ(WaitNotes(peer, "NOTES 2 again"), "NOTES 2 again");

  peer.Kill(SIGKILL);
  auto start = Clock::now();
  Status s;
  while (s.ok() && Clock::now() - start < c().dead_notify_bound) {
    auto call = Clock::now();
    s = r->engine->Notify(peer.engine.key, "anyone?");
    // UcxOptions::connect_timeout (10 s) bounds every call; most return at once.
    EXPECT_LT(Clock::now() - call, std::chrono::seconds(11));
    if (s.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_LT(Clock::now() - start, c().dead_notify_bound);
  EXPECT_EQ(r->engine->Notify(peer.engine.key, "still?").code(), Code::kUnavailable);
}

// A stopped peer (SIGSTOP) never answers: writes that need no help from its threads still land
// (ProcessCase::stopped_write), a notification ends at its deadline; once the peer runs again
// writes, notifications and reads all work.
TEST_P(ProcessConformance, StoppedPeerTakesWritesButNotificationsHitTheDeadline) {
  const size_t kBytes = c().gpu ? 16 << 20 : 1 << 20;
  auto r = MakeRig(c(), kBytes);
  ASSERT_TRUE(r);
  PeerProcess& peer = *r->peer;
  // The whole buffer in 32 KiB blocks, reversed on the far side.
  std::vector<TransferOp> ops;
  for (uint64_t b = 0, n = kBytes / (32 << 10); b < n; ++b) ops.push_back({b << 15, (n - 1 - b) << 15, 32 << 10});
  peer.Signal(SIGSTOP);
  ASSERT_TRUE(peer.WaitStopped());
  TransferOptions o;
  o.deadline = c().stopped_deadline;
  auto start = Clock::now();
  Status plain = r->session.WriteBatch(ops, o).Wait();
  switch (c().stopped_write) {
    case ProcessCase::StoppedWrite::kCompletes:
      EXPECT_TRUE(plain.ok()) << plain.ToString();
      break;
    case ProcessCase::StoppedWrite::kHitsDeadline:
      EXPECT_EQ(plain.code(), Code::kDeadlineExceeded) << plain.ToString();
      EXPECT_LT(Clock::now() - start, c().stopped_bound);
      break;
    case ProcessCase::StoppedWrite::kEither:
      EXPECT_TRUE(plain.ok() || plain.code() == Code::kDeadlineExceeded) << plain.ToString();
      break;
  }
  o.notification = "never read";
  start = Clock::now();
  Status noted = r->session.WriteBatch(ops, o).Wait();
  EXPECT_EQ(noted.code(), Code::kDeadlineExceeded) << noted.ToString();
  EXPECT_LT(Clock::now() - start, c().stopped_bound);
  peer.Signal(SIGCONT);
  std::vector<uint8_t> reversed(kBytes);
  {
    const auto local = r->Contents();
    for (const auto& op : ops) std::memcpy(reversed.data() + op.remote_offset, local.data() + op.local_offset, op.size);
  }
  const std::string want = "HASH " + std::to_string(Fnv(reversed.data(), kBytes));
  if (c().stopped_write == ProcessCase::StoppedWrite::kCompletes) {
    EXPECT_EQ(peer.Command(Rig::HashCmd(0, kBytes)), want);
  }

  // Running again: a write with a notification, then a read of what the peer refilled. (The
  // local bytes stay as they were: a batch that missed its deadline may still land later.)
  TransferOptions again;
  again.notification = "running-again";
  ASSERT_TRUE(r->session.WriteBatch(ops, again).Wait().ok());
  EXPECT_EQ(peer.Command(Rig::HashCmd(0, kBytes)), want);
  // The notification that missed its deadline may still arrive now that the peer runs: only
  // the last one is known.
  const std::string notes = peer.Command("notes");  // "NOTES <count> <last message>"
  EXPECT_EQ(notes.substr(notes.rfind(' ') + 1), "running-again") << notes;
  ASSERT_EQ(peer.Command("fill 3"), "OK");
  ASSERT_TRUE(r->session.Read(0, 0, kBytes).Wait().ok());
  EXPECT_EQ(peer.Command(Rig::HashCmd(0, kBytes)), r->HashOfLocal(0, kBytes));
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcessConformance,
                         ::testing::ValuesIn(ProcessCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ferry
