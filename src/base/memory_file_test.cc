#include "base/memory_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/shared_host.h"
#include "ferry/shared_memory.h"
#include "testing/fault_env.h"

namespace ferry::os {
namespace {

using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

TEST(MemoryFile, CreatedFilesAreSealedAndMapShared) {
  auto fd = CreateMemoryFile("ferry-test", 10000);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(SealedFileSize(fd->get()).value(), 10000u);
  EXPECT_NE(::ftruncate(fd->get(), 100), 0) << "sealed against shrinking";
  auto a = SharedMapping::Map(fd->get(), 0, 10000);
  auto b = SharedMapping::Map(fd->get(), 5000, 100);  // not page-aligned
  ASSERT_TRUE(a.ok() && b.ok());
  std::memcpy(a->data() + 5000, "ferry", 5);
  EXPECT_EQ(std::memcmp(b->data(), "ferry", 5), 0);
  EXPECT_EQ(b->size(), 100u);
  EXPECT_EQ(SharedMapping::Map(fd->get(), 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CreateMemoryFile("empty", 0).status().code(), Code::kInvalidArgument);
}

TEST(MemoryFile, UnsealedOrEmptyFilesAreRefused) {
  UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(SealedFileSize(fd.get()).status().code(), Code::kInvalidArgument) << "empty";
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(SealedFileSize(fd.get()).status().code(), Code::kInvalidArgument) << "not sealed";
}

struct Fault {
  FaultEnv::Call call;
  int err;
};

class AllocateSharedHostFault : public ::testing::TestWithParam<Fault> {};

// A failing memfd_create, ftruncate or mmap: kResourceExhausted, no descriptor left open, and
// the next allocation (the call healed) works.
TEST_P(AllocateSharedHostFault, ReturnsTheErrorAndLeavesNothingOpen) {
  const Fault fault = GetParam();
  const int fds_before = OpenFdCount();
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(fault.call, fault.err);
  auto buffer = AllocateSharedHost(1 << 20);
  EXPECT_EQ(buffer.status().code(), Code::kResourceExhausted) << buffer.status().ToString();
  EXPECT_EQ(env.calls(fault.call), 1);
  EXPECT_EQ(OpenFdCount(), fds_before);
  env.Heal(fault.call);
  auto ok = AllocateSharedHost(1 << 20);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(internal::FindSharedHost(ok->data(), 1 << 20).has_value());
}

INSTANTIATE_TEST_SUITE_P(Calls, AllocateSharedHostFault,
                         ::testing::Values(Fault{FaultEnv::kMemfdCreate, EMFILE},
                                           Fault{FaultEnv::kFtruncate, ENOSPC},
                                           Fault{FaultEnv::kMmap, ENOMEM}));

}  // namespace
}  // namespace ferry::os
