// Descriptor entries of the cuda_ipc transport: round trips, and every malformed input
// rejected with kInvalidArgument.
#include "transport/cuda_ipc/ipc_desc.h"

#include <gtest/gtest.h>

namespace ferry::internal::cuda_ipc {
namespace {

RegionAccess Sample() {
  RegionAccess a;
  a.process_token = "1234:abcdef";
  for (size_t i = 0; i < a.handle.bytes.size(); ++i) a.handle.bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  a.offset = 4096;
  a.allocation_size = 1 << 20;
  a.lease_slot = 17;
  a.region = 42;
  return a;
}

TEST(IpcDesc, RegionRoundTrip) {
  RegionAccess a = Sample();
  auto back = UnpackRegionAccess(PackRegionAccess(a), 8192);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, a);
}

// VMM memory: the pid, the export id and the allocations' descriptors, packed as runs.
RegionAccess VmmSample() {
  RegionAccess a = Sample();
  a.handle = {};
  a.pid = 1234;
  a.export_id = 3;
  a.offset = 4096;
  for (int fd : {40, 41, 42, 50}) a.pieces.push_back({fd, 2 << 20});
  a.pieces.push_back({51, 4 << 20});
  a.allocation_size = 12 << 20;
  return a;
}

TEST(IpcDesc, VmmRegionRoundTrip) {
  RegionAccess a = VmmSample();
  std::string bytes = PackRegionAccess(a);
  auto back = UnpackRegionAccess(bytes, 8192);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, a);
  EXPECT_TRUE(back->vmm());
  EXPECT_TRUE(FitsRegionAccess(a));
  // 4,096 allocations with consecutive descriptors are one run; scattered ones do not fit.
  RegionAccess many = VmmSample();
  many.pieces.clear();
  for (int i = 0; i < 4096; ++i) many.pieces.push_back({100 + i, 2 << 20});
  many.allocation_size = uint64_t{4096} * (2 << 20);
  EXPECT_TRUE(FitsRegionAccess(many));
  auto many_back = UnpackRegionAccess(PackRegionAccess(many), 1 << 20);
  ASSERT_TRUE(many_back.ok()) << many_back.status().ToString();
  EXPECT_EQ(many_back->pieces.size(), 4096u);
  for (auto& p : many.pieces) p.fd *= 2;
  EXPECT_FALSE(FitsRegionAccess(many));
}

TEST(IpcDesc, InconsistentVmmEntriesAreRejected) {
  auto rejected = [](const RegionAccess& a, uint64_t region_size) {
    return UnpackRegionAccess(PackRegionAccess(a), region_size).status().code() == Code::kInvalidArgument;
  };
  RegionAccess a = VmmSample();
  a.allocation_size += 1;  // the pieces do not add up
  EXPECT_TRUE(rejected(a, 1));
  a = VmmSample();
  EXPECT_TRUE(rejected(a, (12 << 20) - 4095));  // the region leaves the pieces
  a.pid = 0;
  EXPECT_TRUE(rejected(a, 1));
  a = VmmSample();
  a.export_id = 0;
  EXPECT_TRUE(rejected(a, 1));
  a = VmmSample();
  a.handle.bytes[0] = 1;  // an IPC handle too
  EXPECT_TRUE(rejected(a, 1));
  a = VmmSample();
  a.pieces[0].fd = -1;  // packs as a huge descriptor number
  EXPECT_TRUE(rejected(a, 1));
  a = VmmSample();
  a.pieces[1].size = 0;
  a.allocation_size -= 2 << 20;
  EXPECT_TRUE(rejected(a, 1));
  // More allocations than a region may span.
  a = VmmSample();
  a.pieces.clear();
  for (size_t i = 0; i <= kMaxVmmPieces; ++i) a.pieces.push_back({static_cast<int>(i), 1});
  a.allocation_size = kMaxVmmPieces + 1;
  a.offset = 0;
  EXPECT_TRUE(rejected(a, 1));
  std::string vmm = PackRegionAccess(VmmSample());
  for (size_t n = 0; n < vmm.size(); ++n)
    EXPECT_EQ(UnpackRegionAccess(vmm.substr(0, n), 1).status().code(), Code::kInvalidArgument) << n;
}

TEST(IpcDesc, EngineRoundTrip) {
  EngineAccess a{"99:token", "/ferry-ipc-99-0011"};
  auto back = UnpackEngineAccess(PackEngineAccess(a));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, a);
}

TEST(IpcDesc, RegionOutsideItsAllocationIsRejected) {
  RegionAccess a = Sample();
  std::string bytes = PackRegionAccess(a);
  // 4096 + (1 MiB - 4096) fits exactly; one byte more does not.
  EXPECT_TRUE(UnpackRegionAccess(bytes, (1 << 20) - 4096).ok());
  EXPECT_EQ(UnpackRegionAccess(bytes, (1 << 20) - 4095).status().code(), Code::kInvalidArgument);
  a.offset = UINT64_MAX;  // would wrap
  EXPECT_EQ(UnpackRegionAccess(PackRegionAccess(a), 2).status().code(), Code::kInvalidArgument);
}

TEST(IpcDesc, RegionZeroAndEmptyTokenAreRejected) {
  RegionAccess a = Sample();
  a.region = 0;
  EXPECT_EQ(UnpackRegionAccess(PackRegionAccess(a), 1).status().code(), Code::kInvalidArgument);
  a = Sample();
  a.process_token.clear();
  EXPECT_EQ(UnpackRegionAccess(PackRegionAccess(a), 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(UnpackEngineAccess(PackEngineAccess(EngineAccess{"", "/x"})).status().code(), Code::kInvalidArgument);
}

TEST(IpcDesc, EveryTruncationIsRejected) {
  std::string region = PackRegionAccess(Sample());
  for (size_t n = 0; n < region.size(); ++n)
    EXPECT_EQ(UnpackRegionAccess(region.substr(0, n), 1).status().code(), Code::kInvalidArgument) << n;
  std::string engine = PackEngineAccess(EngineAccess{"t", "/n"});
  for (size_t n = 0; n < engine.size(); ++n)
    EXPECT_EQ(UnpackEngineAccess(engine.substr(0, n)).status().code(), Code::kInvalidArgument) << n;
}

TEST(IpcDesc, WrongKindOfEntryIsRejected) {
  // An engine entry is not a region entry, and the reverse.
  EXPECT_EQ(UnpackRegionAccess(PackEngineAccess(EngineAccess{"t", "/n"}), 1).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(UnpackEngineAccess(PackRegionAccess(Sample())).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(UnpackRegionAccess("garbage", 1).status().code(), Code::kInvalidArgument);
}

TEST(IpcDesc, FlippedBytesNeverCrash) {
  for (const std::string& region : {PackRegionAccess(Sample()), PackRegionAccess(VmmSample())})
  for (size_t i = 0; i < region.size(); ++i) {
    for (uint8_t bit = 1; bit != 0; bit <<= 1) {
      std::string m = region;
      m[i] = static_cast<char>(m[i] ^ bit);
      auto r = UnpackRegionAccess(m, 1);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
      }
    }
  }
}

}  // namespace
}  // namespace ferry::internal::cuda_ipc
