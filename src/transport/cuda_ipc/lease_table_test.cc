// The lease table: leases against withdrawal, and peers or owners whose process died
// (forked children stand for the other process).
#include "transport/cuda_ipc/lease_table.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace ferry::internal::cuda_ipc {
namespace {

using namespace std::chrono_literals;

TEST(LeaseTable, LeaseFailsOnceTheSlotIsWithdrawn) {
  auto owner = LeaseTable::Create();
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  auto peer = LeaseTable::Open((*owner)->name());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto slot = (*owner)->Publish(7);
  ASSERT_TRUE(slot.ok());
  auto row = (*peer)->ClaimRow();
  ASSERT_TRUE(row.ok());
  EXPECT_TRUE((*peer)->Live(*slot, 7));
  EXPECT_FALSE((*peer)->Acquire(*row, *slot, 8));  // another region's id
  ASSERT_TRUE((*peer)->Acquire(*row, *slot, 7));
  (*peer)->Release(*row, *slot);
  EXPECT_TRUE((*owner)->Revoke(*slot, Deadline::After(1s)).ok());
  EXPECT_FALSE((*peer)->Live(*slot, 7));
  EXPECT_FALSE((*peer)->Acquire(*row, *slot, 7));
  // The slot is reused for a new region id; the old id stays dead.
  auto again = (*owner)->Publish(9);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *slot);
  EXPECT_FALSE((*peer)->Acquire(*row, *slot, 7));
  EXPECT_EQ((*owner)->Publish(0).status().code(), Code::kInvalidArgument);
}

TEST(LeaseTable, RevokeWaitsForALiveLease) {
  auto owner = LeaseTable::Create();
  ASSERT_TRUE(owner.ok());
  auto peer = LeaseTable::Open((*owner)->name());
  ASSERT_TRUE(peer.ok());
  uint32_t slot = *(*owner)->Publish(3);
  uint32_t row = *(*peer)->ClaimRow();
  ASSERT_TRUE((*peer)->Acquire(row, slot, 3));
  // Held: the revocation times out, and the slot is then never reused.
  EXPECT_EQ((*owner)->Revoke(slot, Deadline::After(50ms)).code(), Code::kDeadlineExceeded);
  auto next = (*owner)->Publish(4);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, slot);
  // Released while a revocation waits: it returns OK.
  ASSERT_TRUE((*peer)->Acquire(row, *next, 4));
  std::atomic<bool> returned{false};
  std::thread revoker([&] {
    EXPECT_TRUE((*owner)->Revoke(*next, Deadline::After(10s)).ok());
    returned = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(returned.load());
  (*peer)->Release(row, *next);
  revoker.join();
  EXPECT_TRUE(returned.load());
}

TEST(LeaseTable, OpenRejectsMissingAndForeignSegments) {
  EXPECT_EQ(LeaseTable::Open("/ferry-ipc-does-not-exist").status().code(), Code::kUnavailable);
  EXPECT_EQ(LeaseTable::Open("no-slash").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(LeaseTable::Open("/a/b").status().code(), Code::kInvalidArgument);
  const std::string name = "/ferry-ipc-test-foreign-" + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  EXPECT_EQ(LeaseTable::Open(name).status().code(), Code::kInvalidArgument);  // wrong size
  shm_unlink(name.c_str());
}

// A child process takes a lease and is killed holding it: the owner's revocation ignores it.
TEST(LeaseTable, RevokeIgnoresLeasesOfDeadProcesses) {
  auto owner = LeaseTable::Create();
  ASSERT_TRUE(owner.ok());
  uint32_t slot = *(*owner)->Publish(11);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto peer = LeaseTable::Open((*owner)->name());
    char ok = 0;
    if (peer.ok()) {
      auto row = (*peer)->ClaimRow();
      ok = row.ok() && (*peer)->Acquire(*row, slot, 11) ? 1 : 0;
    }
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  EXPECT_EQ((*owner)->Revoke(slot, Deadline::After(50ms)).code(), Code::kDeadlineExceeded);
  uint32_t slot2 = *(*owner)->Publish(12);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_TRUE((*owner)->Revoke(slot2, Deadline::After(1s)).ok());
}

// The owner is killed: peers see it through OwnerAlive() (transfers then fail kUnavailable).
TEST(LeaseTable, PeerSeesTheOwnerDie) {
  int names[2];
  ASSERT_EQ(pipe(names), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto table = LeaseTable::Create();
    std::string name = table.ok() ? (*table)->name() : "";
    name.resize(96, '\0');
    if (write(names[1], name.data(), name.size()) != 96) _exit(1);
    pause();
    _exit(0);
  }
  char buf[96] = {};
  ASSERT_EQ(read(names[0], buf, sizeof(buf)), 96);
  std::string name(buf);
  ASSERT_FALSE(name.empty());
  auto peer = LeaseTable::Open(name);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_TRUE((*peer)->OwnerAlive());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE((*peer)->OwnerAlive());
  // A killed owner cannot unlink its table; the peer that sees it dead does.
  (*peer)->UnlinkIfOwnerDead();
  EXPECT_EQ(LeaseTable::Open(name).status().code(), Code::kUnavailable);
  close(names[0]);
  close(names[1]);
}

}  // namespace
}  // namespace ferry::internal::cuda_ipc
