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

TEST(MemoryFileFault, FailingMemfdCreateFailsAllocateSharedHostCleanly) {
  const int fds_before = OpenFdCount();
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(FaultEnv::kMemfdCreate, EMFILE);
  auto buffer = AllocateSharedHost(1 << 20);
  EXPECT_EQ(buffer.status().code(), Code::kResourceExhausted) << buffer.status().ToString();
  EXPECT_EQ(env.calls(FaultEnv::kMemfdCreate), 1);
  EXPECT_EQ(OpenFdCount(), fds_before);
}

TEST(MemoryFileFault, FailingMmapFailsAllocateSharedHostCleanly) {
  const int fds_before = OpenFdCount();
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(FaultEnv::kMmap, ENOMEM);
  auto buffer = AllocateSharedHost(1 << 20);
  EXPECT_EQ(buffer.status().code(), Code::kResourceExhausted) << buffer.status().ToString();
  EXPECT_EQ(env.calls(FaultEnv::kMmap), 1);
  EXPECT_EQ(OpenFdCount(), fds_before) << "the memory file is closed";
  env.Heal(FaultEnv::kMmap);
  auto ok = AllocateSharedHost(1 << 20);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(internal::FindSharedHost(ok->data(), 1 << 20).has_value());
}

TEST(MemoryFileFault, FailingFtruncateClosesTheFile) {
  const int fds_before = OpenFdCount();
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(FaultEnv::kFtruncate, ENOSPC);
  EXPECT_EQ(CreateMemoryFile("x", 4096).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(OpenFdCount(), fds_before);
}

}  // namespace
}  // namespace ferry::os
