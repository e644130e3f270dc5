#include "ferry/descriptors.h"

#include <gtest/gtest.h>

#include <random>

namespace ferry {
namespace {

MemoryDesc SampleMemory() {
  MemoryDesc d;
  d.engine_key = "prefill-0";
  d.region = static_cast<RegionId>(7);
  d.address = 0x7f0000001000;
  d.size = 1 << 20;
  d.kind = MemoryKind::kCuda;
  d.device = 1;
  d.host_id = LocalHostId();
  d.access = {{"local", "token"}, {"ucx", std::string("\x00\x01\x02", 3)}};
  return d;
}

EngineDesc SampleEngine() {
  EngineDesc d;
  d.key = "decode-3";
  d.host_id = LocalHostId();
  d.pid = 4242;
  d.addresses = {"10.0.0.2:5000"};
  d.transports = {{"local", "token"}};
  return d;
}

TEST(Descriptors, MemoryRoundTrips) {
  MemoryDesc d = SampleMemory();
  auto back = MemoryDesc::Unpack(d.Pack());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, d);
  ASSERT_NE(back->FindAccess("ucx"), nullptr);
  EXPECT_EQ(back->FindAccess("ucx")->data.size(), 3u);
  EXPECT_EQ(back->FindAccess("none"), nullptr);
}

TEST(Descriptors, EngineRoundTrips) {
  EngineDesc d = SampleEngine();
  auto back = EngineDesc::Unpack(d.Pack());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, d);
}

TEST(Descriptors, RejectEveryTruncation) {
  for (const std::string& bytes : {SampleMemory().Pack(), SampleEngine().Pack()}) {
    for (size_t n = 0; n < bytes.size(); ++n) {
      EXPECT_EQ(MemoryDesc::Unpack(bytes.substr(0, n)).status().code(), Code::kInvalidArgument);
      EXPECT_EQ(EngineDesc::Unpack(bytes.substr(0, n)).status().code(), Code::kInvalidArgument);
    }
  }
}

TEST(Descriptors, RejectTheOtherKind) {
  EXPECT_EQ(EngineDesc::Unpack(SampleMemory().Pack()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MemoryDesc::Unpack(SampleEngine().Pack()).status().code(), Code::kInvalidArgument);
}

TEST(Descriptors, RejectBadFields) {
  MemoryDesc d = SampleMemory();
  d.engine_key = "";
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  d = SampleMemory();
  d.kind = static_cast<MemoryKind>(9);
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  d = SampleMemory();
  d.device = -1;  // CUDA memory without a device
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  d = SampleMemory();
  d.address = UINT64_MAX - 10;  // wraps
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  d = SampleMemory();
  d.engine_key = std::string(kMaxKeyBytes + 1, 'k');
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  d = SampleMemory();
  d.access.assign(kMaxTransportEntries + 1, TransportData{"t", "x"});
  EXPECT_EQ(MemoryDesc::Unpack(d.Pack()).status().code(), Code::kInvalidArgument);
  EngineDesc e = SampleEngine();
  e.protocol_version = kDescriptorVersion + 1;
  auto r = EngineDesc::Unpack(e.Pack());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("version"), std::string_view::npos);
}

TEST(Descriptors, RandomBytesNeverCrash) {
  std::mt19937_64 rng(1);
  std::string base = SampleMemory().Pack();
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = base;
    int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    auto m = MemoryDesc::Unpack(bytes);
    if (m.ok()) {
      EXPECT_TRUE(MemoryDesc::Unpack(m->Pack()).ok());
    }
    (void)EngineDesc::Unpack(bytes);
  }
}

}  // namespace
}  // namespace ferry
