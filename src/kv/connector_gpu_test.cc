// The connector over GPU memory (local transport, one process): a layer saved with the
// ReadyFn of a CUDA event is not read before the event completes, even while the kernel
// before the event keeps the GPU busy for a long time; per-layer checksums computed on the GPU
// equal the host's over the same bytes, and a block corrupted on the consumer fails its
// request. Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/gpu.h"
#include "ferry/kv.h"
#include "kv/checksum.h"

namespace ferry::kv {
namespace {

using namespace std::chrono_literals;

struct GpuWorker {
  std::unique_ptr<Engine> engine;
  CacheLayout layout;
  void* mem = nullptr;
  std::unique_ptr<Connector> conn;
  ~GpuWorker() {
    conn.reset();
    engine.reset();
    if (mem) (void)gpu::DeviceFree(mem);
  }
};

std::unique_ptr<GpuWorker> Make(const std::string& instance, bool checksums = false) {
  auto w = std::make_unique<GpuWorker>();
  CacheLayout id;
  id.model = "gpu-test";
  id.head_dim = 64;
  id.total_kv_heads = 2;
  id.num_layers = 2;
  id.block_tokens = 16;
  id.num_blocks = 8;
  auto l = MakeLayout(id, TensorOrder::kKvFirst, /*one_region=*/true);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return nullptr;
  w->layout = *l;
  EngineOptions eo;
  eo.transports = {"local"};
  eo.key = instance + "-gpu";
  auto e = Engine::Create(eo);
  EXPECT_TRUE(e.ok());
  if (!e.ok()) return nullptr;
  w->engine = std::move(*e);
  auto mem = gpu::DeviceAlloc(0, w->layout.region_bytes[0]);
  EXPECT_TRUE(mem.ok());
  if (!mem.ok()) return nullptr;
  w->mem = *mem;
  EXPECT_TRUE(gpu::MemsetSync(w->mem, 0, w->layout.region_bytes[0]).ok());
  auto d = w->engine->RegisterMemory(w->mem, w->layout.region_bytes[0], MemoryKind::kCuda, 0);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  ConnectorOptions o;
  o.instance = instance;
  o.checksums = checksums;
  auto c = Connector::Create(w->engine.get(), w->layout, {*d}, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  w->conn = std::move(*c);
  return w;
}

TEST(ConnectorGpuTest, ALayerIsNotReadBeforeItsEventCompletes) {
  std::string reason;
  if (!gpu::Available(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  auto p = Make("prefill"), d = Make("decode");
  ASSERT_TRUE(p && d);
  ASSERT_TRUE(p->conn->AddPeer(d->conn->Metadata()).ok());
  ASSERT_TRUE(d->conn->AddPeer(p->conn->Metadata()).ok());
  const std::vector<uint64_t> blocks{0, 1};  // the whole cache's first two blocks, both sides
  const uint64_t bytes = p->layout.region_bytes[0];
  std::vector<uint8_t> pattern(bytes);
  for (uint64_t i = 0; i < bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 1);

  ASSERT_TRUE(d->conn->ExpectWrite("g", "prefill", 0, blocks).ok());
  auto stream = gpu::Stream::Create(0);
  ASSERT_TRUE(stream.ok());
  std::vector<std::unique_ptr<gpu::Event>> events;
  // Each layer: a kernel busy for 300 ms, then the layer's data, then the event.
  for (uint32_t layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE((*stream)->Spin(300ms).ok());
    ASSERT_TRUE((*stream)->CopyAsync(p->mem, pattern.data(), bytes).ok());
    auto ev = gpu::Event::Create(0);
    ASSERT_TRUE(ev.ok());
    ASSERT_TRUE((*ev)->Record((*stream)->handle()).ok());
    ASSERT_TRUE(p->conn->SaveLayer("g", layer, blocks, EventReady((*ev)->handle())).ok());
    events.push_back(std::move(*ev));
  }
  ASSERT_TRUE(p->conn->Seal("g", 2).ok());
  // While the first kernel runs, nothing may have landed.
  std::this_thread::sleep_for(100ms);
  std::vector<uint8_t> got(bytes);
  ASSERT_TRUE(gpu::CopySync(got.data(), d->mem, bytes).ok());
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0; })) << "a write read the layer early";
  std::vector<Finished> f;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (f.empty() && std::chrono::steady_clock::now() < until) f = d->conn->WaitFinished(100ms);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].outcome, Outcome::kDone) << f[0].status.ToString();
  // Every byte of the blocks moved (the two blocks of K and of V of both layers).
  ASSERT_TRUE(gpu::CopySync(got.data(), d->mem, bytes).ok());
  uint64_t moved = 0, bad = 0;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (const TensorLayout* t : {&d->layout.layers[layer].k, &*d->layout.layers[layer].v}) {
      for (uint64_t b : blocks) {
        const uint64_t at = t->offset + b * t->block_stride;
        for (uint64_t i = 0; i < t->block_stride; ++i) bad += got[at + i] != pattern[at + i];
        moved += t->block_stride;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(moved, 2ull * 2 * 2 * d->layout.layers[0].k.block_stride);
  auto pf = p->conn->WaitFinished(5s);
  ASSERT_EQ(pf.size(), 1u);
  EXPECT_EQ(pf[0].outcome, Outcome::kDone);
}

// A cache in GPU memory, filled with random bytes, and a host copy of them.
struct DeviceCache {
  CacheLayout layout;
  std::vector<void*> mem;
  std::vector<std::vector<std::byte>> host;
  std::vector<const std::byte*> host_bases;
  std::vector<MemoryDesc> regions;
  ~DeviceCache() {
    for (void* m : mem) (void)gpu::DeviceFree(m);
  }
};

void ExpectGpuEqualsHost(const CacheLayout& identity, TensorOrder order, uint64_t tokens) {
  SCOPED_TRACE(std::string(TensorOrderName(order)) + " head_dim " + std::to_string(identity.head_dim) + " tokens " +
               std::to_string(tokens));
  auto l = MakeLayout(identity, order);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  DeviceCache c;
  c.layout = *l;
  uint64_t x = 0x2545f4914f6cdd1dULL;
  for (uint64_t bytes : c.layout.region_bytes) {
    auto m = gpu::DeviceAlloc(0, bytes);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    c.mem.push_back(*m);
    std::vector<std::byte> h(bytes);
    for (auto& b : h) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<std::byte>(x >> 24);
    }
    ASSERT_TRUE(gpu::CopySync(*m, h.data(), bytes).ok());
    MemoryDesc d;
    d.address = reinterpret_cast<uint64_t>(*m);
    d.size = bytes;
    d.kind = MemoryKind::kCuda;
    d.device = 0;
    c.regions.push_back(d);
    c.host.push_back(std::move(h));
  }
  for (auto& h : c.host) c.host_bases.push_back(h.data());
  auto sums = Checksummer::Create(c.layout, c.regions);
  ASSERT_TRUE(sums.ok()) << sums.status().ToString();
  ASSERT_TRUE((*sums)->on_gpu(0));
  std::vector<uint64_t> blocks;  // scattered, last block first
  for (uint64_t i = 0; i * c.layout.block_tokens < tokens; ++i) blocks.push_back(c.layout.num_blocks - 1 - 2 * i);
  const HeadRange held = HeadsOf(c.layout.total_kv_heads, c.layout.mla, c.layout.tp_size, c.layout.tp_rank);
  // Every case started before any is collected: several checksums in flight at once.
  std::vector<PendingChecksum> jobs;
  std::vector<uint64_t> want;
  for (uint32_t layer = 0; layer < c.layout.num_layers; ++layer) {
    for (HeadRange heads : {held, HeadRange{held.begin, held.begin + 1}}) {
      for (uint64_t n : {tokens, tokens / 2 + 1, uint64_t{0}}) {
        auto job = (*sums)->Start(blocks, n, heads, layer);
        ASSERT_TRUE(job.ok()) << job.status().ToString();
        jobs.push_back(*job);
        want.push_back(LayerChecksum(c.layout, c.host_bases, blocks, n, heads, layer));
      }
    }
  }
  std::vector<uint64_t> got;
  ASSERT_TRUE((*sums)->FinishAll(jobs, Deadline::After(10s), &got).ok());
  EXPECT_EQ(got, want);
  // Slots are reused once collected: the same again gives the same.
  jobs.clear();
  for (uint32_t layer = 0; layer < c.layout.num_layers; ++layer) {
    auto job = (*sums)->Start(blocks, tokens, held, layer);
    ASSERT_TRUE(job.ok());
    auto v = (*sums)->Finish(*job, Deadline::After(10s));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, LayerChecksum(c.layout, c.host_bases, blocks, tokens, held, layer));
  }
}

CacheLayout SumIdentity(uint32_t heads, uint32_t head_dim, uint32_t block_tokens, uint64_t blocks) {
  CacheLayout id;
  id.model = "gpu-sum";
  id.head_dim = head_dim;
  id.total_kv_heads = heads;
  id.num_layers = 2;
  id.block_tokens = block_tokens;
  id.num_blocks = blocks;
  return id;
}

TEST(ConnectorGpuTest, GpuChecksumsEqualTheHostsOverTheSameBytes) {
  std::string reason;
  if (!gpu::Available(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  // Many slices (more than one pass of the grid), 256-byte heads.
  ExpectGpuEqualsHost(SumIdentity(8, 128, 16, 512), TensorOrder::kKvFirst, 4000);
  // TP 2 rank 1 of 8 heads, HND, a kernel block of 16 in blocks of 64.
  CacheLayout hnd = SumIdentity(8, 64, 64, 64);
  hnd.tp_rank = 1;
  hnd.tp_size = 2;
  hnd.kernel_block_tokens = 16;
  ExpectGpuEqualsHost(hnd, TensorOrder::kBlocksFirstHnd, 700);
  // Slices of 6 and 10 bytes: words across 8-byte boundaries and a tail in each.
  ExpectGpuEqualsHost(SumIdentity(4, 3, 16, 32), TensorOrder::kBlocksFirst, 100);
  ExpectGpuEqualsHost(SumIdentity(2, 5, 8, 32), TensorOrder::kSeparate, 90);
  // MLA: one latent of 576 elements (1,152 bytes, several words a lane).
  CacheLayout mla = SumIdentity(1, 576, 16, 64);
  mla.mla = true;
  ExpectGpuEqualsHost(mla, TensorOrder::kMla, 300);
}

TEST(ConnectorGpuTest, ChecksumsOverGpuMemoryPassAndACorruptedBlockFails) {
  std::string reason;
  if (!gpu::Available(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  auto p = Make("prefill-sum", /*checksums=*/true), d = Make("decode-sum", /*checksums=*/true);
  ASSERT_TRUE(p && d);
  ASSERT_TRUE(p->conn->AddPeer(d->conn->Metadata()).ok());
  ASSERT_TRUE(d->conn->AddPeer(p->conn->Metadata()).ok());
  const std::vector<uint64_t> pb{0, 1}, db{3, 6};
  const uint64_t bytes = p->layout.region_bytes[0];
  std::vector<uint8_t> pattern(bytes);
  for (uint64_t i = 0; i < bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_TRUE(gpu::CopySync(p->mem, pattern.data(), bytes).ok());
  auto collect = [](GpuWorker& w) {
    std::vector<Finished> f;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (f.empty() && std::chrono::steady_clock::now() < until) f = w.conn->WaitFinished(100ms);
    return f;
  };
  auto run = [&](const std::string& id, bool corrupt) {
    ASSERT_TRUE(d->conn->ExpectWrite(id, "prefill-sum", 0, db).ok());
    const uint64_t written = p->conn->stats().layers_written;
    for (uint32_t layer = 0; layer < 2; ++layer) ASSERT_TRUE(p->conn->SaveLayer(id, layer, pb).ok());
    if (corrupt) {
      // Once both layers landed, one byte of layer 1's V in the consumer's second block
      // changes behind the connector's back (a stale writer), before the completion is sent.
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (p->conn->stats().layers_written < written + 2 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      ASSERT_EQ(p->conn->stats().layers_written, written + 2);
      const TensorLayout& v = *d->layout.layers[1].v;
      auto* at = static_cast<uint8_t*>(d->mem) + v.offset + db[1] * v.block_stride + 40;
      uint8_t b = 0;
      ASSERT_TRUE(gpu::CopySync(&b, at, 1).ok());
      b ^= 0x01;
      ASSERT_TRUE(gpu::CopySync(at, &b, 1).ok());
    }
    ASSERT_TRUE(p->conn->Seal(id, 2).ok());
  };
  run("good", false);
  auto ok = collect(*d);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].outcome, Outcome::kDone) << ok[0].status.ToString();
  ASSERT_EQ(collect(*p).size(), 1u);
  // The bytes did land where the consumer's layout puts them.
  std::vector<uint8_t> got(bytes);
  ASSERT_TRUE(gpu::CopySync(got.data(), d->mem, bytes).ok());
  uint64_t bad = 0;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (const TensorLayout* t : {&d->layout.layers[layer].k, &*d->layout.layers[layer].v}) {
      for (size_t i = 0; i < db.size(); ++i) {
        for (uint64_t j = 0; j < t->block_stride; ++j) {
          bad += got[t->offset + db[i] * t->block_stride + j] != pattern[t->offset + pb[i] * t->block_stride + j];
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(d->conn->stats().checksum_failures, 0u);

  run("bad", true);
  auto failed = collect(*d);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].outcome, Outcome::kFailed);
  EXPECT_EQ(failed[0].status.code(), Code::kDataLoss) << failed[0].status.ToString();
  EXPECT_NE(failed[0].status.ToString().find("layer 1"), std::string::npos) << failed[0].status.ToString();
  EXPECT_EQ(d->conn->stats().checksum_failures, 1u);
  EXPECT_EQ(collect(*p).size(), 1u);
}

}  // namespace
}  // namespace ferry::kv
