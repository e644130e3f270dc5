// CacheLayout and WorkerMetadata on the wire: round trips, the compatibility hash, the field
// named by CheckCompatible, and every malformed case refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/codec.h"
#include "ferry/kv.h"

namespace ferry::kv {
namespace {

using ::testing::HasSubstr;

CacheLayout Layout(TensorOrder order = TensorOrder::kKvFirst, bool one_region = false) {
  CacheLayout id;
  id.model = "llama-3-8b";
  id.head_dim = 128;
  id.total_kv_heads = 8;
  id.mla = order == TensorOrder::kMla;
  if (id.mla) id.total_kv_heads = 1;
  id.num_layers = 3;
  id.tp_rank = 1;
  id.tp_size = 2;
  id.dp_rank = 5;
  id.block_tokens = 32;
  id.kernel_block_tokens = 16;
  id.num_blocks = 10;
  Result<CacheLayout> got = MakeLayout(id, order, one_region);
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  return got.ok() ? *got : id;
}

TEST(KvLayoutWire, EveryOrderRoundTrips) {
  for (TensorOrder order : {TensorOrder::kKvFirst, TensorOrder::kBlocksFirstHnd,
                            TensorOrder::kSeparate, TensorOrder::kMla}) {
    for (bool one : {false, true}) {
      CacheLayout l = Layout(order, one);
      Result<CacheLayout> got = CacheLayout::Unpack(l.Pack());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, l) << TensorOrderName(order);
    }
  }
}

TEST(KvLayoutWire, MalformedLayoutsAreRefused) {
  const CacheLayout base = Layout();
  const std::string bytes = base.Pack();
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(CacheLayout::Unpack(bytes.substr(0, n)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CacheLayout::Unpack(bytes + '\x01').status().code(), Code::kInvalidArgument);
  auto expect = [](const CacheLayout& l, std::string_view what) {
    Result<CacheLayout> got = CacheLayout::Unpack(l.Pack());
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(what));
  };
  CacheLayout l = base;
  l.layers.pop_back();  // Unpack validates: fewer layers than num_layers
  expect(l, "layers");
  l = base;
  l.layers[1].k.region = 99;
  expect(l, "region");
  l = base;
  l.region_bytes[0] -= 1;  // the last block's bytes leave the region
  expect(l, "reaches");
  l = base;
  l.model = std::string(kMaxNameBytes + 1, 'm');
  expect(l, "model");
  l = base;
  l.layers.assign(kMaxLayers + 1, base.layers[0]);
  l.num_layers = kMaxLayers + 1;
  expect(l, "");
  // Another encoding of the same fields: the metadata's.
  WorkerMetadata m;
  EXPECT_EQ(CacheLayout::Unpack(m.Pack()).status().code(), Code::kInvalidArgument);
}

TEST(KvLayoutWire, CompatibilityHashIsStableAndCoversTheIdentity) {
  const CacheLayout base = Layout();
  // A golden value: the hash travels between builds and hosts, so it must never change by
  // accident (change it only with kKvVersion).
  EXPECT_EQ(base.CompatibilityHash(), 0x6d77a678d0e4dbcdull)
      << std::hex << base.CompatibilityHash();
  // What may differ between the sides does not change it.
  CacheLayout other = Layout(TensorOrder::kSeparateHnd, true);
  other.tp_rank = 0;
  other.tp_size = 4;
  other.dp_rank = 0;
  other.block_tokens = 16;
  other.num_blocks = 77;
  EXPECT_EQ(other.CompatibilityHash(), base.CompatibilityHash());
  // Each field that must agree does.
  std::vector<std::function<void(CacheLayout&)>> changes = {
      [](CacheLayout& c) { c.model += "x"; },  [](CacheLayout& c) { c.dtype_bytes = 1; },
      [](CacheLayout& c) { c.head_dim = 64; }, [](CacheLayout& c) { c.total_kv_heads = 16; },
      [](CacheLayout& c) { c.mla = true; },    [](CacheLayout& c) { c.num_layers = 4; },
  };
  for (auto& change : changes) {
    CacheLayout c = base;
    change(c);
    EXPECT_NE(c.CompatibilityHash(), base.CompatibilityHash());
  }
  // The model's length is part of it: ("ab", 1) and ("a", ...) do not run together.
  CacheLayout a = base, b = base;
  a.model = "ab";
  b.model = "a";
  EXPECT_NE(a.CompatibilityHash(), b.CompatibilityHash());
}

TEST(KvLayoutWire, CheckCompatibleNamesTheFirstField) {
  const CacheLayout base = Layout();
  EXPECT_TRUE(CheckCompatible(base, Layout(TensorOrder::kBlocksFirst)).ok());
  const std::vector<std::pair<std::function<void(CacheLayout&)>, std::string>> cases = {
      {[](CacheLayout& c) { c.model = "qwen"; }, "model: llama-3-8b vs qwen"},
      {[](CacheLayout& c) { c.dtype_bytes = 1; }, "dtype_bytes: 2 vs 1"},
      {[](CacheLayout& c) { c.head_dim = 64; }, "head_dim: 128 vs 64"},
      {[](CacheLayout& c) { c.total_kv_heads = 4; }, "total_kv_heads: 8 vs 4"},
      {[](CacheLayout& c) { c.mla = true; }, "mla: false vs true"},
      {[](CacheLayout& c) { c.num_layers = 2; }, "num_layers: 3 vs 2"},
      {[](CacheLayout& c) {
         c.head_dim = 64;
         c.num_layers = 2;
       },
       "head_dim: 128 vs 64"},
  };
  for (const auto& [change, message] : cases) {
    CacheLayout c = base;
    change(c);
    Status s = CheckCompatible(base, c);
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_EQ(s.message(), message);
  }
}

TEST(KvLayoutWire, WorkerIdToString) {
  EXPECT_EQ((WorkerId{"prefill-a", 0, 3}.ToString()), "prefill-a/dp0/tp3");
}

WorkerMetadata Metadata() {
  WorkerMetadata m;
  m.layout = Layout(TensorOrder::kSeparate);
  m.id = WorkerId{"prefill-a", m.layout.dp_rank, m.layout.tp_rank};
  m.engine.key = "engine-7";
  m.engine.host_id = "host/boot";
  m.engine.pid = 4242;
  m.engine.addresses = {"10.0.0.2:7000"};
  m.engine.transports = {TransportData{"shm", "token"}};
  for (size_t i = 0; i < m.layout.region_bytes.size(); ++i) {
    MemoryDesc d;
    d.engine_key = m.engine.key;
    d.region = static_cast<RegionId>(i + 1);
    d.address = 0x10000 * (i + 1);
    d.size = m.layout.region_bytes[i] + i;  // a region may be larger than the layout needs
    d.host_id = m.engine.host_id;
    d.access = {TransportData{"shm", "fd" + std::to_string(i)}};
    m.regions.push_back(d);
  }
  m.compatibility_hash = m.layout.CompatibilityHash();
  return m;
}

TEST(KvLayoutWire, MetadataRoundTrips) {
  const WorkerMetadata m = Metadata();
  Result<WorkerMetadata> got = WorkerMetadata::Unpack(m.Pack());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->version, m.version);
  EXPECT_EQ(got->id, m.id);
  EXPECT_EQ(got->engine, m.engine);
  EXPECT_EQ(got->layout, m.layout);
  EXPECT_EQ(got->regions, m.regions);
  EXPECT_EQ(got->compatibility_hash, m.compatibility_hash);
}

TEST(KvLayoutWire, MalformedMetadataIsRefused) {
  const std::string bytes = Metadata().Pack();
  for (size_t n = 0; n < bytes.size(); n += (n < 64 ? 1 : 7))
    EXPECT_EQ(WorkerMetadata::Unpack(bytes.substr(0, n)).status().code(), Code::kInvalidArgument);
  auto expect = [](const WorkerMetadata& m, std::string_view what) {
    Result<WorkerMetadata> got = WorkerMetadata::Unpack(m.Pack());
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(what));
  };
  WorkerMetadata m = Metadata();
  m.version = kKvVersion + 1;
  expect(m, "version: 3 vs 2");
  m = Metadata();
  m.compatibility_hash ^= 1;
  expect(m, "compatibility hash");
  m = Metadata();
  m.layout.head_dim = 64;  // the hash was of the other layout (and the layout is still valid)
  expect(m, "compatibility hash");
  m = Metadata();
  m.regions.pop_back();
  expect(m, "regions for a layout of");
  m = Metadata();
  m.regions.push_back(m.regions.back());
  expect(m, "regions for a layout of");
  m = Metadata();
  m.regions[1].size = m.layout.region_bytes[1] - 1;
  expect(m, "smaller than");
  m = Metadata();
  m.regions[0].engine_key = "engine-8";
  expect(m, "belongs to engine");
  m = Metadata();
  m.id.tp_rank = 0;
  expect(m, "holds the layout");
  m = Metadata();
  m.id.dp_rank = 4;
  expect(m, "holds the layout");
  m = Metadata();
  m.id.instance.clear();
  expect(m, "instance");
  m = Metadata();
  m.engine.key.clear();  // the engine descriptor's own decoder refuses it
  for (auto& r : m.regions) r.engine_key.clear();
  expect(m, "engine key");
  m = Metadata();
  m.layout.num_blocks = 0;  // the layout's Validate refuses it
  m.compatibility_hash = m.layout.CompatibilityHash();
  expect(m, "num_blocks");
  // A version-2 envelope whose body is not this version's shape is refused by its version.
  codec::Writer w;
  w.Array(2);
  w.Str("ferry.kv.meta");
  w.UInt(kKvVersion + 1);
  Result<WorkerMetadata> got = WorkerMetadata::Unpack(w.Take());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("version: 3 vs 2"));
  EXPECT_EQ(WorkerMetadata::Unpack(Metadata().layout.Pack()).status().code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::kv
