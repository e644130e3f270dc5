// The KV planner's cost per piece, planned and posted, side by side with a naive per-piece
// planner (src/kv/planner_reference.h):
//  - plan/{ferry,naive}: BuildPlan for one request of a 61-layer model whose ops are ~1M
//    pieces of 64 B: 8192 tokens in 512 scattered blocks of 16 on each side, NHD, 2 KV heads
//    at the producer (TP 1) and 1 at the consumer (rank 1 of TP 2), head_dim 32 in bf16. Each
//    (token, tensor, layer) is a 64 B piece that joins none other (2 * 8192 * 61 = 999,424).
//    The naive planner computes every piece from the layout formula, one at a time.
//  - plan_and_post/{ferry,naive}: the same plan, then each op group posted as one write batch
//    (Session::Post) through the `local` transport of an Engine between two registered host
//    buffers, then every batch waited for. Counters, per piece: plan_ns, post_ns (until the
//    last Post returned), wait_ns (until every copy finished) and total_ns. Each group's
//    batch is under the engine's parallel_copy_bytes, so Post copies it before it returns;
//    plan_and_post/ferry_copy_threads sets parallel_copy_bytes to 0 so that the copy threads
//    do it and post_ns is the cost of posting alone.
// Target: plan + post <= 50 ns a piece.
// Run: build/<preset>/bench/ferry_bench_kv_plan (results in bench/results/kv_plan.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/kv.h"
#include "kv/planner.h"
#include "kv/planner_reference.h"

namespace {

using ferry::kv::CacheLayout;
using ferry::kv::Plan;
using ferry::kv::PlanInput;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kLayers = 61;
constexpr uint64_t kTokens = 8192;
constexpr uint32_t kBlockTokens = 16;
constexpr uint64_t kBlocks = 600;  // per side; the request uses 512 of them

struct HostBuffer {
  explicit HostBuffer(uint64_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    if (data != nullptr) std::memset(data, 1, bytes);  // fault every page in before timing
  }
  ~HostBuffer() { std::free(data); }
  std::byte* data;
};

struct Rig {
  CacheLayout src, dst;
  std::vector<uint64_t> src_blocks, dst_blocks;
  std::unique_ptr<HostBuffer> src_mem, dst_mem;
  std::unique_ptr<ferry::Engine> engine;
  ferry::Session session;
  std::string error;
  PlanInput input() const { return PlanInput{&src, &dst, src_blocks, dst_blocks}; }
};

std::vector<uint64_t> Scattered(uint64_t seed) {
  std::vector<uint64_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  // Drop the (rare) neighbours so that no two blocks in a row are adjacent.
  std::vector<uint64_t> out;
  for (uint64_t id : ids) {
    if (out.empty() || (id != out.back() + 1 && id + 1 != out.back())) out.push_back(id);
    if (out.size() == kTokens / kBlockTokens) break;
  }
  return out;
}

// offload: copies go to the engine's copy threads (parallel_copy_bytes 0), so Post returns
// before they run; otherwise batches under 4 MiB (each group here) are copied inside Post.
Rig* GetRig(bool offload = false) {
  static std::unique_ptr<Rig> rigs[2];
  auto& rig = rigs[offload ? 1 : 0];
  if (rig) return rig.get();
  rig = std::make_unique<Rig>();
  auto fail = [&](const ferry::Status& s) {
    rig->error = s.ToString();
    return rig.get();
  };
  CacheLayout id;
  id.model = "bench";
  id.dtype_bytes = 2;
  id.head_dim = 32;
  id.total_kv_heads = 2;
  id.num_layers = kLayers;
  id.block_tokens = kBlockTokens;
  id.num_blocks = kBlocks;
  auto src = ferry::kv::MakeLayout(id, ferry::kv::TensorOrder::kKvFirst, /*one_region=*/true);
  if (!src.ok()) return fail(src.status());
  id.tp_size = 2;
  id.tp_rank = 1;
  auto dst = ferry::kv::MakeLayout(id, ferry::kv::TensorOrder::kKvFirst, /*one_region=*/true);
  if (!dst.ok()) return fail(dst.status());
  rig->src = *src;
  rig->dst = *dst;
  rig->src_blocks = Scattered(1);
  rig->dst_blocks = Scattered(2);
  if (rig->src_blocks.size() * kBlockTokens < kTokens || rig->dst_blocks.size() * kBlockTokens < kTokens)
    return fail(ferry::Status(ferry::Code::kInternal, "too few scattered blocks"));
  rig->src_mem = std::make_unique<HostBuffer>(rig->src.region_bytes[0]);
  rig->dst_mem = std::make_unique<HostBuffer>(rig->dst.region_bytes[0]);
  if (rig->src_mem->data == nullptr || rig->dst_mem->data == nullptr)
    return fail(ferry::Status(ferry::Code::kResourceExhausted, "out of memory"));
  ferry::EngineOptions options;
  options.key = offload ? "kv-plan-bench-offload" : "kv-plan-bench";
  if (offload) options.parallel_copy_bytes = 0;
  options.transports = {"local"};
  auto engine = ferry::Engine::Create(options);
  if (!engine.ok()) return fail(engine.status());
  rig->engine = std::move(engine).value();
  auto l = rig->engine->RegisterMemory(rig->src_mem->data, rig->src.region_bytes[0]);
  if (!l.ok()) return fail(l.status());
  auto r = rig->engine->RegisterMemory(rig->dst_mem->data, rig->dst.region_bytes[0]);
  if (!r.ok()) return fail(r.status());
  auto session = rig->engine->OpenSession(*l, *r);
  if (!session.ok()) return fail(session.status());
  rig->session = *session;
  return rig.get();
}

// The naive planner: one op per (layer, tensor, token, head), straight from the formula, in
// one group per layer (every tensor of this layout lives in region 0 on both sides).
void NaivePlan(const PlanInput& in, Plan* plan) {
  plan->Clear();
  for (uint32_t l = 0; l < in.src->num_layers; ++l) {
    PlanInput one = in;
    one.first_layer = l;
    one.layer_count = 1;
    const size_t begin = plan->ops.size();
    ferry::kv::reference::ForEachUnit(one, kTokens, [&](const ferry::kv::reference::Unit& u) {
      plan->ops.push_back(ferry::TransferOp{u.src, u.dst, in.src->head_bytes()});
    });
    plan->groups.push_back({l, 0, 0, begin, plan->ops.size(), 0});
  }
}

void SetPerPiece(benchmark::State& state, const char* name, double ns, uint64_t pieces) {
  state.counters[name] = ns / static_cast<double>(state.iterations() * pieces);
}

void PlanOnly(benchmark::State& state, bool naive) {
  Rig* rig = GetRig();
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  Plan plan;
  const PlanInput in = rig->input();
  for (auto _ : state) {
    if (naive) {
      NaivePlan(in, &plan);
    } else if (ferry::Status s = ferry::kv::BuildPlan(in, &plan); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
    benchmark::DoNotOptimize(plan.ops.data());
  }
  state.counters["pieces"] = static_cast<double>(plan.ops.size());
  state.counters["time_per_piece"] = benchmark::Counter(
      static_cast<double>(plan.ops.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void PlanAndPost(benchmark::State& state, bool naive, bool offload = false) {
  Rig* rig = GetRig(offload);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  Plan plan;
  const PlanInput in = rig->input();
  std::vector<ferry::Transfer> transfers;
  double plan_ns = 0, post_ns = 0, wait_ns = 0;
  auto ns = [](Clock::time_point a, Clock::time_point b) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  };
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (naive) {
      NaivePlan(in, &plan);
    } else if (ferry::Status s = ferry::kv::BuildPlan(in, &plan); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
    const auto t1 = Clock::now();
    transfers.clear();
    for (const ferry::kv::OpGroup& g : plan.groups) {
      // The group's ops move into the engine (no second copy there).
      std::vector<ferry::TransferOp> ops(plan.ops.begin() + g.begin, plan.ops.begin() + g.end);
      transfers.push_back(rig->session.Post(ferry::Op::kWrite, std::move(ops)));
    }
    const auto t2 = Clock::now();
    if (ferry::Status s = ferry::WaitAll(transfers); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
    const auto t3 = Clock::now();
    plan_ns += ns(t0, t1);
    post_ns += ns(t1, t2);
    wait_ns += ns(t2, t3);
  }
  const uint64_t pieces = plan.ops.size();
  state.counters["pieces"] = static_cast<double>(pieces);
  SetPerPiece(state, "plan_ns", plan_ns, pieces);
  SetPerPiece(state, "post_ns", post_ns, pieces);
  SetPerPiece(state, "plan_post_ns", plan_ns + post_ns, pieces);
  SetPerPiece(state, "wait_ns", wait_ns, pieces);
  SetPerPiece(state, "total_ns", plan_ns + post_ns + wait_ns, pieces);
}

BENCHMARK_CAPTURE(PlanOnly, ferry, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(PlanOnly, naive, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(PlanAndPost, ferry, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(PlanAndPost, naive, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(PlanAndPost, ferry_copy_threads, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
