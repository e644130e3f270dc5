#include "embed/service/shared_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "testing/fault_env.h"

namespace ferry::embed::service {
namespace {

using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

TEST(EmbedSharedMemory, TravelsOverTheSocketAndMapsWhole) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto mem = SharedMemory::Create("test", 4096);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  (*mem)->data()[100] = 77;
  int fds[] = {(*mem)->fd()};
  ASSERT_TRUE(Send(b.get(), "memory", fds).ok());
  Result<Message> m = Receive(a.get(), Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->fds.size(), 1u);
  auto mapped = SharedMemory::Map(std::move(m->fds[0]));
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ((*mapped)->bytes(), 4096u);
  EXPECT_EQ((*mapped)->data()[100], 77);
  EXPECT_TRUE((*mapped)->Contains(4000, 96));
  EXPECT_FALSE((*mapped)->Contains(4000, 97));
  EXPECT_FALSE((*mapped)->Contains(~0ull, 2));
  EXPECT_EQ(SharedMemory::Create("empty", 0).status().code(), Code::kInvalidArgument);
}

TEST(EmbedSharedMemory, RefusesUnsealedFiles) {
  int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  EXPECT_EQ(SharedMemory::Map(UniqueFd(fd)).status().code(), Code::kInvalidArgument);
}

TEST(EmbedSharedMemoryFault, FailingMemfdCreateOrMmapLeavesNothingOpen) {
  auto received = SharedMemory::Create("received", 4096);  // as if it came from a client
  ASSERT_TRUE(received.ok());
  UniqueFd copy(::dup((*received)->fd()));
  const int fds_before = OpenFdCount();
  FaultEnv env;
  os::ScopedEnv scope(&env);
  env.Fail(FaultEnv::kMemfdCreate, EMFILE);
  EXPECT_EQ(SharedMemory::Create("inputs", 4096).status().code(), Code::kResourceExhausted);
  env.Heal(FaultEnv::kMemfdCreate);
  env.Fail(FaultEnv::kMmap, ENOMEM);
  EXPECT_EQ(SharedMemory::Create("inputs", 4096).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(OpenFdCount(), fds_before);
  EXPECT_EQ(SharedMemory::Map(std::move(copy)).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(OpenFdCount(), fds_before - 1) << "the received descriptor was closed";
}

}  // namespace
}  // namespace ferry::embed::service
