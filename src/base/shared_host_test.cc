#include "base/shared_host.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "ferry/shared_memory.h"

namespace ferry {
namespace {

using internal::FindSharedHost;

TEST(SharedHost, AllocatesZeroedSealedMemory) {
  auto b = AllocateSharedHost(10000);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_NE(b->data(), nullptr);
  EXPECT_EQ(b->size(), 10000u);
  EXPECT_TRUE(static_cast<bool>(*b));
  for (size_t i = 0; i < b->size(); ++i) ASSERT_EQ(b->data()[i], std::byte{0});
  std::memset(b->data(), 7, b->size());
  auto span = FindSharedHost(b->data(), b->size());
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->offset, 0u);
  // The file is sealed: nobody can shrink it under a peer's mapping.
  int seals = fcntl(span->fd, F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(ftruncate(span->fd, 0), 0);
  struct stat st = {};
  ASSERT_EQ(fstat(span->fd, &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), 10000u);
}

TEST(SharedHost, EmptyIsRejected) {
  EXPECT_EQ(AllocateSharedHost(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(AllocateSharedHost(uint64_t{1} << 60).status().code(), Code::kResourceExhausted);
}

TEST(SharedHost, RegistryFindsRangesInsideBuffersOnly) {
  auto a = AllocateSharedHost(1 << 20);
  auto b = AllocateSharedHost(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::byte* p = a->data();
  auto inner = FindSharedHost(p + 4096 + 3, 1000);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->offset, 4099u);
  EXPECT_TRUE(FindSharedHost(p, 1 << 20).has_value());
  EXPECT_TRUE(FindSharedHost(p + (1 << 20) - 1, 1).has_value());
  EXPECT_FALSE(FindSharedHost(p + (1 << 20) - 1, 2).has_value()) << "range runs past the end";
  EXPECT_FALSE(FindSharedHost(p, UINT64_MAX).has_value());
  EXPECT_FALSE(FindSharedHost(p - 1, 2).has_value()) << "range starts before the buffer";
  std::vector<uint8_t> heap(4096);
  EXPECT_FALSE(FindSharedHost(heap.data(), heap.size()).has_value());
  EXPECT_NE(FindSharedHost(b->data(), 4096)->fd, inner->fd);
  // Gone with the buffer, and with the buffer it was moved into.
  HostBuffer moved = std::move(*a);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_TRUE(FindSharedHost(p, 16).has_value());
  moved = HostBuffer();
  EXPECT_FALSE(FindSharedHost(p, 16).has_value());
}

}  // namespace
}  // namespace ferry
