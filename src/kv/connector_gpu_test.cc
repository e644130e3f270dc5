// The connector over GPU memory (local transport, one process): a layer saved with the
// ReadyFn of a CUDA event is not read before the event completes, even while the kernel
// before the event keeps the GPU busy for a long time. Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/gpu.h"
#include "ferry/kv.h"

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

std::unique_ptr<GpuWorker> Make(const std::string& instance) {
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

}  // namespace
}  // namespace ferry::kv
