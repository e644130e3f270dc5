#include "base/os.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

#include "base/deadline.h"
#include "testing/fault_env.h"

namespace ferry::os {
namespace {

using fault_testing::FaultEnv;

TEST(OsEnv, ScopedEnvInstallsAndRestores) {
  Env* before = Env::Current();
  EXPECT_EQ(before, Env::Default());
  {
    FaultEnv outer;
    ScopedEnv a(&outer);
    EXPECT_EQ(Env::Current(), &outer);
    {
      FaultEnv inner;
      ScopedEnv b(&inner);
      EXPECT_EQ(Env::Current(), &inner);
    }
    EXPECT_EQ(Env::Current(), &outer);
  }
  EXPECT_EQ(Env::Current(), before);
}

TEST(OsEnv, WrapperForwardsWhatItDoesNotOverride) {
  FaultEnv env;
  ScopedEnv scope(&env);
  int fds[2];
  ASSERT_EQ(Env::Current()->SocketPair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_EQ(Env::Current()->Close(fds[0]), 0);
  EXPECT_EQ(Env::Current()->Close(fds[1]), 0);
  env.Fail(FaultEnv::kSocket, EMFILE);
  EXPECT_EQ(Env::Current()->Socket(AF_UNIX, SOCK_SEQPACKET, 0), -1);
  EXPECT_EQ(errno, EMFILE);
  EXPECT_EQ(env.calls(FaultEnv::kSocket), 1);
}

TEST(OsEnv, SharedMemoryObjectsGoThroughTheSeam) {
  FaultEnv env;
  ScopedEnv scope(&env);
  const std::string name = "/ferry-os-test-" + std::to_string(getpid());
  const int fd = Env::Current()->ShmOpen(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Env::Current()->ShmOpen(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600), -1);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(Env::Current()->Close(fd), 0);
  EXPECT_EQ(Env::Current()->ShmUnlink(name.c_str()), 0);
  EXPECT_EQ(Env::Current()->ShmUnlink(name.c_str()), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST(OsEnv, ErrnoMapsToTheCodeTheCallerActsOn) {
  EXPECT_EQ(ErrnoCode(ENOENT), Code::kNotFound);
  EXPECT_EQ(ErrnoCode(EACCES), Code::kPermissionDenied);
  EXPECT_EQ(ErrnoCode(EMFILE), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoCode(EAGAIN), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoCode(ECONNREFUSED), Code::kUnavailable);
  EXPECT_EQ(ErrnoCode(EPIPE), Code::kUnavailable);
  EXPECT_EQ(ErrnoCode(EINVAL), Code::kInvalidArgument);
  EXPECT_EQ(ErrnoCode(ETIMEDOUT), Code::kDeadlineExceeded);
  EXPECT_EQ(ErrnoCode(EIO), Code::kInternal);
  Status s = ErrnoStatus("connect /x", ECONNREFUSED);
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.message(), "connect /x: Connection refused");
  EXPECT_EQ(ErrnoStatus(Code::kAborted, "x", EIO).code(), Code::kAborted);
}

TEST(OsEnv, DeadlinesReadTheClockThroughTheSeam) {
  FaultEnv env;
  ScopedEnv scope(&env);
  Deadline d = Deadline::After(std::chrono::minutes(10));
  EXPECT_FALSE(d.expired());
  env.JumpClock(std::chrono::hours(1));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining(), Clock::duration::zero());
}

}  // namespace
}  // namespace ferry::os
