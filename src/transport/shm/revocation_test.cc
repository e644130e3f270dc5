#include "transport/shm/revocation.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace ferry::internal::shm {
namespace {

TEST(ShmRevocation, PeersSeeRevocationsAndSlotsAreReusedSafely) {
  auto table = RevocationTable::Create();
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  auto view = RevocationView::Map((*table)->fd());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto [slot, generation] = (*table)->Publish();
  ASSERT_NE(slot, kNoSlot);
  EXPECT_TRUE((*view)->Live(slot, generation));
  EXPECT_FALSE((*view)->Live(slot, generation + 1));
  (*table)->Revoke(slot);
  EXPECT_FALSE((*view)->Live(slot, generation));
  // The slot serves the next region; the old generation stays revoked.
  auto [again, next] = (*table)->Publish();
  EXPECT_EQ(again, slot);
  EXPECT_NE(next, generation);
  EXPECT_TRUE((*view)->Live(again, next));
  EXPECT_FALSE((*view)->Live(slot, generation));
  EXPECT_TRUE((*view)->Live(kNoSlot, 123)) << "regions without a slot are revoked by message";
}

TEST(ShmRevocation, FullTableHandsOutNoSlot) {
  auto table = RevocationTable::Create();
  ASSERT_TRUE(table.ok());
  for (uint32_t i = 0; i < kRevocationSlots; ++i) ASSERT_NE((*table)->Publish().first, kNoSlot);
  EXPECT_EQ((*table)->Publish().first, kNoSlot);
}

TEST(ShmRevocation, ViewRefusesUnsealedOrSmallFiles) {
  int fd = memfd_create("ferry-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8), 0);
  EXPECT_EQ(RevocationView::Map(fd).status().code(), Code::kInvalidArgument);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(RevocationView::Map(fd).status().code(), Code::kInvalidArgument) << "too small";
  close(fd);
}

}  // namespace
}  // namespace ferry::internal::shm
