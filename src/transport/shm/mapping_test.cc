#include "transport/shm/mapping.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "base/shared_host.h"
#include "ferry/shared_memory.h"

namespace ferry::internal::shm {
namespace {

TEST(ShmMapping, MapsTheSameBytesAtAnOffset) {
  auto b = AllocateSharedHost(3 * 4096);
  ASSERT_TRUE(b.ok());
  auto span = FindSharedHost(b->data() + 5000, 100);
  ASSERT_TRUE(span.has_value());
  auto m = Mapping::Map(span->fd, span->offset, 100);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NE((*m)->base(), b->data() + 5000) << "a second mapping, not the same address";
  std::memcpy((*m)->base(), "ferry", 5);
  EXPECT_EQ(std::memcmp(b->data() + 5000, "ferry", 5), 0);
}

TEST(ShmMapping, RefusesUnsealedOrShortFiles) {
  int fd = memfd_create("ferry-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  EXPECT_EQ(Mapping::Map(fd, 0, 4096).status().code(), Code::kInvalidArgument) << "not sealed";
  close(fd);
  auto b = AllocateSharedHost(4096);
  ASSERT_TRUE(b.ok());
  int sealed = FindSharedHost(b->data(), 1)->fd;
  EXPECT_EQ(Mapping::Map(sealed, 4096, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Mapping::Map(sealed, 1, 4096).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Mapping::Map(sealed, UINT64_MAX, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Mapping::Map(sealed, 0, 0).status().code(), Code::kInvalidArgument);
}

TEST(ShmMapping, RevokedSlotUnmapsAfterTheLastUser) {
  auto b = AllocateSharedHost(4096);
  ASSERT_TRUE(b.ok());
  auto m = Mapping::Map(FindSharedHost(b->data(), 1)->fd, 0, 4096);
  ASSERT_TRUE(m.ok());
  MappingSlot slot(std::move(m).value(), 1, 4096);
  auto in_flight = slot.Acquire();
  ASSERT_TRUE(in_flight);
  int unmapped = 0;
  EXPECT_TRUE(slot.Revoke([&] { ++unmapped; }));
  EXPECT_FALSE(slot.live());
  EXPECT_EQ(slot.Acquire(), nullptr);
  EXPECT_EQ(unmapped, 0) << "a transfer still copies through it";
  in_flight.reset();
  EXPECT_EQ(unmapped, 1);
  EXPECT_FALSE(slot.Revoke([&] { ++unmapped; }));
  EXPECT_EQ(unmapped, 1);
}

}  // namespace
}  // namespace ferry::internal::shm
