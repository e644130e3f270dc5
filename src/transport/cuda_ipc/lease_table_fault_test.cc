// The lease table when the OS refuses it memory: shm_open, ftruncate or mmap failing (through
// the OS seam) ends in kUnavailable with no descriptor left open and, for the owner, no name
// left behind in /dev/shm.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "testing/fault_env.h"
#include "transport/cuda_ipc/lease_table.h"

namespace ferry::internal::cuda_ipc {
namespace {

using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

// A FaultEnv that also records the shared memory names opened and unlinked, and can make
// shm_open fail.
class ShmEnv : public FaultEnv {
 public:
  int ShmOpen(const char* name, int oflag, mode_t mode) override EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      opened_.push_back(name);
    }
    if (shm_open_errno_ != 0) {
      errno = shm_open_errno_;
      return -1;
    }
    return FaultEnv::ShmOpen(name, oflag, mode);
  }
  int ShmUnlink(const char* name) override EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      unlinked_.push_back(name);
    }
    return FaultEnv::ShmUnlink(name);
  }
  void FailShmOpen(int err) { shm_open_errno_ = err; }
  std::vector<std::string> opened() {
    MutexLock lock(&mu_);
    return opened_;
  }
  std::vector<std::string> unlinked() {
    MutexLock lock(&mu_);
    return unlinked_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> opened_ GUARDED_BY(mu_);
  std::vector<std::string> unlinked_ GUARDED_BY(mu_);
  int shm_open_errno_ = 0;
};

bool ShmNameExists(const std::string& name) { return access(("/dev/shm" + name).c_str(), F_OK) == 0; }

class LeaseTableFault : public ::testing::Test {
 protected:
  // Create() with `call` failing with `err`: kUnavailable after `mmaps` calls of mmap, and
  // nothing left behind: no descriptor, and the one shared memory object it made unlinked.
  void ExpectCreateFailsLeavingNothing(FaultEnv::Call call, int err, int mmaps) {
    const int fds_before = OpenFdCount();
    env_.Fail(call, err);
    EXPECT_EQ(LeaseTable::Create().status().code(), Code::kUnavailable);
    EXPECT_EQ(env_.calls(FaultEnv::kMmap), mmaps);
    EXPECT_EQ(OpenFdCount(), fds_before) << "the shared memory object's descriptor was closed";
    ASSERT_EQ(env_.opened().size(), 1u);
    EXPECT_EQ(env_.unlinked(), env_.opened());
    EXPECT_FALSE(ShmNameExists(env_.opened()[0]));
  }

  ShmEnv env_;
  os::ScopedEnv scoped_{&env_};
};

TEST_F(LeaseTableFault, CreateWhoseMappingFailsLeavesNothing) {
  ASSERT_NO_FATAL_FAILURE(ExpectCreateFailsLeavingNothing(FaultEnv::kMmap, ENOMEM, 1));
  // Nothing is broken for good: once mmap works, a table is made.
  env_.Heal(FaultEnv::kMmap);
  auto again = LeaseTable::Create();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(ShmNameExists((*again)->name()));
}

TEST_F(LeaseTableFault, CreateWhoseSizingFailsLeavesNothing) {
  ExpectCreateFailsLeavingNothing(FaultEnv::kFtruncate, ENOSPC, 0);
}

TEST_F(LeaseTableFault, CreateWhoseShmOpenFailsIsUnavailable) {
  const int fds_before = OpenFdCount();
  env_.FailShmOpen(EMFILE);
  EXPECT_EQ(LeaseTable::Create().status().code(), Code::kUnavailable);
  EXPECT_EQ(env_.calls(FaultEnv::kFtruncate), 0);
  EXPECT_EQ(OpenFdCount(), fds_before);
}

TEST_F(LeaseTableFault, OpenWhoseMappingFailsLeavesTheTableUsable) {
  auto owner = LeaseTable::Create();
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  const int fds_before = OpenFdCount();
  env_.Fail(FaultEnv::kMmap, ENOMEM);
  EXPECT_EQ(LeaseTable::Open((*owner)->name()).status().code(), Code::kUnavailable);
  EXPECT_EQ(OpenFdCount(), fds_before) << "the peer's descriptor was closed";
  EXPECT_TRUE(env_.unlinked().empty()) << "a peer never unlinks a live owner's table";
  env_.Heal(FaultEnv::kMmap);
  auto peer = LeaseTable::Open((*owner)->name());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto slot = (*owner)->Publish(5);
  ASSERT_TRUE(slot.ok());
  EXPECT_TRUE((*peer)->Live(*slot, 5));
}

}  // namespace
}  // namespace ferry::internal::cuda_ipc
