// The KV connector against the engine it runs on, two workers of this process over one
// transport (shm by default; FERRY_BENCH_TRANSPORT=local|shm|ucx):
//  - layer_push/engine: a request's layers written with the engine's own batched writes (one
//    Session::Post per layer of the planner's ops, then wait for all), the baseline;
//  - layer_push/connector: the same request through the connector in write mode (ExpectWrite,
//    SaveLayer per layer, Seal; until both sides report it done). Target: >= 0.95x the
//    engine's bytes per second, same run.
//  - control_path: small requests (one block, two layers of a tiny model) from allocation to
//    done on both sides, 64 in flight. Target: >= 10,000 requests per second.
//  - checksum/host: one layer's checksum (ConnectorOptions::checksums) over host memory, one
//    thread, no transfer: its cost per MiB.
// The model of the layer pushes is llama-3.1-8b on one TP rank: 32 layers, 8 KV heads, head dim
// 128, bf16, blocks of 16 tokens, KV-first; requests of 1024 tokens in scattered blocks, one or
// four in flight at once (/1, /4).
// Run: build/<preset>/bench/ferry_bench_kv_connector (results in bench/results/kv_connector.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/kv.h"
#include "ferry/shared_memory.h"
#include "kv/checksum.h"
#include "kv/planner.h"

namespace {

using namespace std::chrono_literals;
using ferry::kv::CacheLayout;

std::string Transport() {
  const char* t = std::getenv("FERRY_BENCH_TRANSPORT");
  return t && *t ? t : "shm";
}

struct Side {
  std::vector<ferry::HostBuffer> buffers;
  std::unique_ptr<ferry::Engine> engine;
  CacheLayout layout;
  std::vector<ferry::MemoryDesc> regions;
  std::unique_ptr<ferry::kv::Connector> conn;
};

constexpr uint64_t kBlocksPerSide = 320;  // room for 5 requests' disjoint blocks

CacheLayout Model(bool tiny, uint32_t tp_rank) {
  CacheLayout l;
  l.model = tiny ? "tiny" : "llama-3.1-8b";
  l.dtype_bytes = 2;
  l.head_dim = tiny ? 8 : 128;
  l.total_kv_heads = tiny ? 1 : 8;
  l.num_layers = tiny ? 2 : 32;
  l.tp_rank = tp_rank;
  l.tp_size = 1;
  l.block_tokens = 16;
  l.num_blocks = tiny ? 1024 : kBlocksPerSide;
  return l;
}

std::unique_ptr<Side> MakeSide(const std::string& instance, bool tiny) {
  auto s = std::make_unique<Side>();
  auto layout = ferry::kv::MakeLayout(Model(tiny, 0), ferry::kv::TensorOrder::kKvFirst);
  if (!layout.ok()) return nullptr;
  s->layout = *layout;
  ferry::EngineOptions eo;
  eo.transports = {Transport()};
  eo.key = instance + "-bench";
  auto e = ferry::Engine::Create(eo);
  if (!e.ok()) return nullptr;
  s->engine = std::move(*e);
  for (uint64_t bytes : s->layout.region_bytes) {
    auto b = ferry::AllocateSharedHost(bytes);
    if (!b.ok()) return nullptr;
    std::fill(b->data(), b->data() + bytes, std::byte{1});
    auto d = s->engine->RegisterMemory(b->data(), bytes);
    if (!d.ok()) return nullptr;
    s->regions.push_back(*d);
    s->buffers.push_back(std::move(*b));
  }
  ferry::kv::ConnectorOptions o;
  o.instance = instance;
  auto c = ferry::kv::Connector::Create(s->engine.get(), s->layout, s->regions, o);
  if (!c.ok()) return nullptr;
  s->conn = std::move(*c);
  return s;
}

struct Pair {
  std::unique_ptr<Side> p, d;
  static std::unique_ptr<Pair> Make(bool tiny) {
    auto pair = std::make_unique<Pair>();
    pair->p = MakeSide("prefill", tiny);
    pair->d = MakeSide("decode", tiny);
    if (!pair->p || !pair->d) return nullptr;
    if (!pair->p->conn->AddPeer(pair->d->conn->Metadata()).ok()) return nullptr;
    if (!pair->d->conn->AddPeer(pair->p->conn->Metadata()).ok()) return nullptr;
    return pair;
  }
};

std::vector<uint64_t> Scattered(uint64_t n, uint64_t of, uint64_t seed) {
  std::vector<uint64_t> ids(of);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  ids.resize(n);
  return ids;
}

constexpr uint64_t kTokens = 1024;  // a request: 64 blocks of 16 tokens, 4 MiB a layer

// The blocks of request `i` of a batch: disjoint, scattered over the cache.
std::vector<uint64_t> RequestBlocks(int i, uint64_t seed) {
  const auto all = Scattered(kBlocksPerSide, kBlocksPerSide, seed);
  const uint64_t n = kTokens / 16;
  return std::vector<uint64_t>(all.begin() + i * n, all.begin() + (i + 1) * n);
}

// state.range(0) requests in flight at once: 1 shows a request's whole cost, 4 the rate at
// which requests that overlap move (as in serving).
void BM_LayerPushEngine(benchmark::State& state) {
  auto pair = Pair::Make(false);
  if (!pair) return state.SkipWithError("setup failed");
  const int in_flight = static_cast<int>(state.range(0));
  std::vector<ferry::kv::Plan> plans(in_flight);
  std::vector<std::vector<uint64_t>> pbs, dbs;
  for (int i = 0; i < in_flight; ++i) {
    pbs.push_back(RequestBlocks(i, 1));
    dbs.push_back(RequestBlocks(i, 2));
    ferry::kv::PlanInput in;
    in.src = &pair->p->layout;
    in.dst = &pair->d->layout;
    in.src_blocks = pbs.back();
    in.dst_blocks = dbs.back();
    if (!ferry::kv::BuildPlan(in, &plans[i]).ok()) return state.SkipWithError("plan failed");
  }
  std::map<std::pair<uint32_t, uint32_t>, ferry::Session> sessions;
  for (const auto& g : plans[0].groups) {
    auto s = pair->p->engine->OpenSession(pair->p->regions[g.local_region], pair->d->regions[g.remote_region]);
    if (!s.ok()) return state.SkipWithError(s.status().ToString().c_str());
    sessions[{g.local_region, g.remote_region}] = *s;
  }
  uint64_t bytes = 0;
  for (auto _ : state) {
    std::vector<ferry::Transfer> ts;
    for (const auto& plan : plans) {
      for (const auto& g : plan.groups) {
        ts.push_back(sessions[{g.local_region, g.remote_region}].Post(
            ferry::Op::kWrite, std::span<const ferry::TransferOp>(plan.ops.data() + g.begin, g.end - g.begin)));
      }
      bytes += plan.bytes;
    }
    if (!ferry::WaitAll(ts).ok()) return state.SkipWithError("write failed");
  }
  state.SetBytesProcessed(int64_t(bytes));
}

void BM_LayerPushConnector(benchmark::State& state) {
  auto pair = Pair::Make(false);
  if (!pair) return state.SkipWithError("setup failed");
  const int in_flight = static_cast<int>(state.range(0));
  const uint32_t layers = pair->p->layout.num_layers;
  std::vector<std::vector<uint64_t>> pbs, dbs;
  for (int i = 0; i < in_flight; ++i) {
    pbs.push_back(RequestBlocks(i, 1));
    dbs.push_back(RequestBlocks(i, 2));
  }
  uint64_t n = 0;
  auto batch = [&]() -> bool {
    for (int i = 0; i < in_flight; ++i) {
      const std::string id = "r" + std::to_string(n++);
      if (!pair->d->conn->ExpectWrite(id, "prefill", 0, dbs[i]).ok()) return false;
      for (uint32_t l = 0; l < layers; ++l) (void)pair->p->conn->SaveLayer(id, l, pbs[i]);
      (void)pair->p->conn->Seal(id, layers);
    }
    // Blocking waits (as WaitAll in the engine case): a spinning waiter would take a core from
    // the copy threads.
    for (auto* side : {pair->d.get(), pair->p.get()}) {
      int ended = 0;
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (ended < in_flight && std::chrono::steady_clock::now() < until) {
        for (const auto& f : side->conn->WaitFinished(100ms)) {
          if (f.outcome != ferry::kv::Outcome::kDone) return false;
          ++ended;
        }
      }
      if (ended < in_flight) return false;
    }
    return true;
  };
  // The first batch opens the sessions (and maps the peer's regions): as the engine case
  // does before its loop.
  if (!batch()) return state.SkipWithError("warm-up requests failed");
  const uint64_t bytes_before = pair->p->conn->stats().bytes;
  for (auto _ : state) {
    if (!batch()) return state.SkipWithError("request failed");
  }
  state.SetBytesProcessed(int64_t(pair->p->conn->stats().bytes - bytes_before));
}

void BM_ControlPath(benchmark::State& state) {
  auto pair = Pair::Make(true);
  if (!pair) return state.SkipWithError("setup failed");
  constexpr int kInFlight = 64;
  const uint32_t layers = pair->p->layout.num_layers;
  uint64_t next = 0, done = 0;
  for (auto _ : state) {
    // One step: start kInFlight requests, then wait for all of them to end on both sides.
    for (int i = 0; i < kInFlight; ++i) {
      const std::string id = "c" + std::to_string(next);
      const std::vector<uint64_t> pb{next % 1024}, db{(next * 7) % 1024};
      ++next;
      if (!pair->d->conn->ExpectWrite(id, "prefill", 0, db).ok()) return state.SkipWithError("expect failed");
      for (uint32_t l = 0; l < layers; ++l) (void)pair->p->conn->SaveLayer(id, l, pb);
      (void)pair->p->conn->Seal(id, layers);
    }
    size_t ended = 0;
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (ended < 2 * kInFlight && std::chrono::steady_clock::now() < until) {
      for (auto* side : {pair->d.get(), pair->p.get()}) {
        for (const auto& f : side->conn->WaitFinished(200us)) {
          if (f.outcome != ferry::kv::Outcome::kDone) return state.SkipWithError(f.status.ToString().c_str());
          ++ended;
        }
      }
    }
    if (ended < 2 * kInFlight) return state.SkipWithError("requests did not end in 30 s");
    done += kInFlight;
  }
  state.SetItemsProcessed(int64_t(done));
  state.counters["requests_per_s"] = benchmark::Counter(double(done), benchmark::Counter::kIsRate);
}

// The time from the producer's Seal to the consumer seeing the request done, with every layer
// saved before: the completion's way alone (the notification after the last write, the
// consumer's wake-up), one request at a time. Reported as the median of the iterations.
void BM_SealToDone(benchmark::State& state) {
  auto pair = Pair::Make(true);
  if (!pair) return state.SkipWithError("setup failed");
  const uint32_t layers = pair->p->layout.num_layers;
  uint64_t n = 0;
  std::vector<double> us;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string id = "s" + std::to_string(n);
    const std::vector<uint64_t> pb{n % 1024}, db{(n * 7) % 1024};
    ++n;
    if (!pair->d->conn->ExpectWrite(id, "prefill", 0, db).ok()) return state.SkipWithError("expect failed");
    for (uint32_t l = 0; l < layers; ++l) (void)pair->p->conn->SaveLayer(id, l, pb);
    while (pair->p->conn->stats().layers_written < n * layers) std::this_thread::yield();
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    (void)pair->p->conn->Seal(id, layers);
    std::vector<ferry::kv::Finished> f;
    while (f.empty()) f = pair->d->conn->WaitFinished(1s);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    state.PauseTiming();
    while (pair->p->conn->WaitFinished(1s).empty()) {
    }
    state.ResumeTiming();
  }
  std::sort(us.begin(), us.end());
  if (!us.empty()) {
    state.counters["p50_us"] = us[us.size() / 2];
    state.counters["p99_us"] = us[us.size() * 99 / 100];
  }
}

// One layer of a request (kTokens tokens in scattered blocks) hashed as a producer does it.
void BM_ChecksumHost(benchmark::State& state) {
  auto layout = ferry::kv::MakeLayout(Model(false, 0), ferry::kv::TensorOrder::kKvFirst);
  if (!layout.ok()) return state.SkipWithError(layout.status().ToString().c_str());
  std::vector<std::vector<std::byte>> buffers;
  std::vector<const std::byte*> bases;
  std::mt19937_64 rng(7);
  for (uint64_t bytes : layout->region_bytes) {
    buffers.emplace_back(bytes);
    for (auto& b : buffers.back()) b = static_cast<std::byte>(rng());
    bases.push_back(buffers.back().data());
  }
  const auto blocks = Scattered(kTokens / 16, kBlocksPerSide, 11);
  const ferry::kv::HeadRange heads{0, layout->total_kv_heads};
  const uint64_t bytes = kTokens * heads.size() * 2 * layout->head_bytes();
  uint32_t layer = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ferry::kv::LayerChecksum(*layout, bases, blocks, kTokens, heads, layer));
    layer = (layer + 1) % layout->num_layers;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  // Seconds a MiB (printed with an SI prefix: "250u" is 250 us).
  state.counters["s_per_MiB"] = benchmark::Counter(static_cast<double>(state.iterations()) * bytes / (1 << 20),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_LayerPushEngine)->Name("layer_push/engine")->Arg(1)->Arg(4)->UseRealTime()->MinTime(1.0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LayerPushConnector)->Name("layer_push/connector")->Arg(1)->Arg(4)->UseRealTime()->MinTime(1.0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SealToDone)->Name("seal_to_done")->UseRealTime()->Iterations(300)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ControlPath)->Name("control_path")->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChecksumHost)->Name("checksum/host")->MinTime(0.5)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
