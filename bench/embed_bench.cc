// Embedding-offload benchmarks (src/embed/), side by side with the machine's bound in the same
// run:
//  - row_ids/<tokens>x<reqs>/threads:<t>: row ids of a step with the model's layout (V 248320,
//    N 3, H 8, E 2560, B 2e7): 8192 tokens in 8 requests (prefill) and 256 in 256 (decode).
//  - gather/<tokens>x<reqs>/threads:<t>/prefetch:<rows>/nt:<0|1>: ids precomputed, rows copied
//    from a synthetic bf16 table (320-byte rows) into a [T, 2560] destination, with or without
//    prefetching and non-temporal stores (the defaults: prefetch 32, nt 0).
//  - gather_step/...: ids and rows in one pass (Gatherer::GatherStep).
//  - random_row_read/threads:<t>: the bound: t threads each read random 320-byte rows of the
//    same table (every cache line touched, prefetched ahead, one add per line), nothing written.
//  With a GPU (registered only then), the same steps delivered into device memory:
//  - uva_gather/<tokens>x<reqs>: the UVA kernel computes ids and reads the pinned table itself
//    (a cycle of distinct steps; uva_gather_same_step: one step again and again)
//    (inputs already on the device), until the stream is idle;
//  - cpu_gather_copy/<tokens>x<reqs>/threads:<t>: GatherStep into a pinned staging buffer, then
//    one copy to the device: what the CPU service does for one TP rank, without the IPC.
// The table has the model's shape but a base vocabulary B scaled so that it holds
// FERRY_EMBED_TABLE_GB gigabytes (default 4; the model's own table is 102 GB). Gather rates are
// bytes of rows moved per second; compare them with random_row_read at the same thread count.
// Run: build/release/bench/ferry_bench_embed (results in bench/results/embed_cpu.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/runtime.h"
#include "cuda/stream_ops.h"
#include "embed/gather.h"
#include "embed/row_ids.h"
#include "embed/uva.h"
#include "ferry/embed.h"

namespace {

using namespace ferry::embed;

constexpr int64_t kEos = 1;

double TableGigabytes() {
  const char* env = std::getenv("FERRY_EMBED_TABLE_GB");
  double gb = env ? std::atof(env) : 4.0;
  return gb > 0 ? gb : 4.0;
}

const Layout& ModelLayout() {
  static const Layout layout = Layout::Create(Config::Model(kEos)).value();
  return layout;
}

// The model's layout with B scaled so that the bf16 table holds TableGigabytes().
const Layout& BenchLayout() {
  static const Layout layout = [] {
    Config c = Config::Model(kEos);
    c.base_vocab = static_cast<uint64_t>(TableGigabytes() * 1e9 / (320.0 * 16));
    return Layout::Create(c).value();
  }();
  return layout;
}

Table& BenchTable() {
  static const std::unique_ptr<Table> table = [] {
    ferry::ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                           "fill");
    return Table::Synthetic(BenchLayout(), Dtype::kBf16, &pool).value();
  }();
  return *table;
}

struct Step {
  std::vector<int32_t> tokens, qsl, ctx;
  StepInput input() const { return StepInput{tokens, qsl, ctx}; }
};

// `reqs` requests of tokens / reqs tokens each: random ids with an EOS about every 500.
Step MakeStep(int tokens, int reqs, int variant = 0) {
  std::mt19937 rng(tokens * 31 + reqs * 7 + variant * 1000003);
  Step s;
  for (int r = 0; r <= reqs; ++r) s.qsl.push_back(static_cast<int32_t>(int64_t{tokens} * r / reqs));
  s.tokens.resize(tokens);
  for (auto& t : s.tokens) t = rng() % 500 == 0 ? kEos : static_cast<int32_t>(rng() % 248320);
  s.ctx.resize(reqs * 2);
  for (auto& t : s.ctx) t = static_cast<int32_t>(rng() % 248320);
  return s;
}

void RowIds(benchmark::State& state) {
  const int tokens = static_cast<int>(state.range(0)), reqs = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  Step step = MakeStep(tokens, reqs);
  std::vector<uint64_t> ids(tokens * 16);
  std::unique_ptr<ferry::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<ferry::ThreadPool>(threads - 1, "ids");
  for (auto _ : state) {
    if (!ComputeRowIds(ModelLayout(), step.input(), ids, pool.get()).ok())
      state.SkipWithError("ids");
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

// Distinct steps cycled through, so that a benchmark moves at least kCycleBytes of rows per
// cycle and rows are not found in the 32 MiB L3 from a previous iteration.
constexpr uint64_t kCycleBytes = 256ull << 20;

void GatherBench(benchmark::State& state, bool fused) {
  const int tokens = static_cast<int>(state.range(0)), reqs = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const int prefetch = static_cast<int>(state.range(3));
  const bool nt = state.range(4) != 0;
  const Table& table = BenchTable();
  const uint64_t step_bytes = uint64_t{16} * tokens * table.row_bytes();
  const int cycle = static_cast<int>((kCycleBytes + step_bytes - 1) / step_bytes);
  std::vector<Step> steps;
  std::vector<std::vector<uint64_t>> ids(cycle, std::vector<uint64_t>(tokens * 16));
  for (int i = 0; i < cycle; ++i) {
    steps.push_back(MakeStep(tokens, reqs, i));
    if (!ComputeRowIds(BenchLayout(), steps[i].input(), ids[i]).ok()) state.SkipWithError("ids");
  }
  std::vector<uint8_t> dst(step_bytes, 1);
  auto gatherer =
      Gatherer::Create({.threads = threads, .prefetch_rows = prefetch, .streaming_stores = nt})
          .value();
  int i = 0;
  for (auto _ : state) {
    ferry::Status s = fused ? gatherer->GatherStep(BenchLayout(), table, steps[i].input(), dst)
                            : gatherer->Gather(table, 16, ids[i], dst);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(dst.data());
    i = (i + 1) % cycle;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(dst.size()));
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["cycle"] = cycle;
}

void Gather(benchmark::State& state) { GatherBench(state, false); }
void GatherStepBench(benchmark::State& state) { GatherBench(state, true); }

// The bound: random 320-byte rows read with nothing else to do. Each benchmark thread walks its
// own 2^20 random ids per iteration (320 MiB of rows, ten times the L3, so rows come from
// DRAM as in the gathers); every line of every row is touched, rows are prefetched 32 ahead.
void RandomRowRead(benchmark::State& state) {
  const Table& table = BenchTable();
  const uint64_t rb = table.row_bytes();
  constexpr int kRows = 1 << 20, kAhead = 32;
  std::vector<uint64_t> ids(kRows);
  std::mt19937_64 rng(state.thread_index() + 1);
  for (auto& id : ids) id = rng() % table.rows();
  uint64_t sum = 0;
  for (auto _ : state) {
    for (int i = 0; i < kRows; ++i) {
      if (i + kAhead < kRows) {
        const uint8_t* p = table.Row(ids[i + kAhead]);
        for (uint64_t off = 0; off < rb + 63; off += 64)
          __builtin_prefetch(p + std::min(off, rb - 1), 0, 0);
      }
      const uint8_t* row = table.Row(ids[i]);
      for (uint64_t off = 0; off < rb; off += 64)
        sum += *reinterpret_cast<const uint64_t*>(row + off);
      sum += *reinterpret_cast<const uint64_t*>(row + rb - 8);
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * kRows * static_cast<int64_t>(rb));
}

std::vector<int64_t> ThreadCounts() {
  std::vector<int64_t> counts = {1, 2};
  int64_t n = std::thread::hardware_concurrency();
  if (n > 2) counts.push_back(n);
  return counts;
}

// (prefetch rows, non-temporal stores): without prefetching, with streaming stores, the default.
void StepArgs(benchmark::internal::Benchmark* b, bool variants) {
  using Variant = std::pair<int64_t, int64_t>;
  const std::vector<Variant> all = {{0, 0}, {32, 1}, {32, 0}}, dflt = {{32, 0}};
  for (auto [tokens, reqs] : {std::pair{8192, 8}, std::pair{256, 256}})
    for (int64_t t : ThreadCounts())
      for (auto [pf, nt] : variants ? all : dflt) b->Args({tokens, reqs, t, pf, nt});
}

BENCHMARK(RowIds)
    ->Name("row_ids")
    ->ArgNames({"tokens", "reqs", "threads"})
    ->Apply([](auto* b) {
      for (auto [tokens, reqs] : {std::pair{8192, 8}, std::pair{256, 256}})
        for (int64_t t : ThreadCounts()) b->Args({tokens, reqs, t});
    }) -> UseRealTime();
BENCHMARK(Gather)
    ->Name("gather")
    ->ArgNames({"tokens", "reqs", "threads", "prefetch", "nt"})
    ->Apply([](auto* b) { StepArgs(b, true); }) -> UseRealTime();
BENCHMARK(GatherStepBench)
    ->Name("gather_step")
    ->ArgNames({"tokens", "reqs", "threads", "prefetch", "nt"})
    ->Apply([](auto* b) { StepArgs(b, false); }) -> UseRealTime();
BENCHMARK(RandomRowRead)
    ->Name("random_row_read")
    ->Apply([](auto* b) {
      for (int64_t t : ThreadCounts()) b->Threads(static_cast<int>(t));
    }) -> UseRealTime();

// The GPU benchmarks: device dst of one step; inputs of every step of the cycle on the device.
struct DeviceSteps {
  std::vector<Step> steps;
  std::vector<void*> inputs;  // per step: tokens, qsl, ctx back to back (int32)
  void* dst = nullptr;
  ~DeviceSteps() {
    for (void* p : inputs) (void)ferry::cuda::Free(p);
    if (dst) (void)ferry::cuda::Free(dst);
  }
};

bool MakeDeviceSteps(int tokens, int reqs, DeviceSteps* d, uint64_t* step_bytes, int* cycle) {
  *step_bytes = uint64_t{16} * tokens * BenchTable().row_bytes();
  *cycle = static_cast<int>((kCycleBytes + *step_bytes - 1) / *step_bytes);
  for (int i = 0; i < *cycle; ++i) {
    d->steps.push_back(MakeStep(tokens, reqs, i));
    const Step& s = d->steps.back();
    const size_t n = s.tokens.size() + s.qsl.size() + s.ctx.size();
    auto buf = ferry::cuda::Malloc(0, n * 4);
    if (!buf.ok()) return false;
    d->inputs.push_back(*buf);
    auto* p = static_cast<int32_t*>(*buf);
    if (!ferry::cuda::CopySync(p, s.tokens.data(), s.tokens.size() * 4).ok() ||
        !ferry::cuda::CopySync(p + s.tokens.size(), s.qsl.data(), s.qsl.size() * 4).ok() ||
        !ferry::cuda::CopySync(p + s.tokens.size() + s.qsl.size(), s.ctx.data(), s.ctx.size() * 4)
             .ok())
      return false;
  }
  auto dst = ferry::cuda::Malloc(0, *step_bytes);
  if (!dst.ok()) return false;
  d->dst = *dst;
  return true;
}

// range(2) == 1: the same step every iteration, so its rows' address translations stay cached
// (how the 79% figure for a plain kernel was measured; bench/results/uva_translation_h200.md).
void UvaGather(benchmark::State& state) {
  const int tokens = static_cast<int>(state.range(0)), reqs = static_cast<int>(state.range(1));
  const bool same_step = state.range(2) == 1;
  Table& table = BenchTable();
  if (!table.pinned() && !table.Pin().ok()) return state.SkipWithError("pin");
  auto uva = UvaGatherer::Create(BenchLayout(), table);
  if (!uva.ok()) return state.SkipWithError(uva.status().ToString().c_str());
  DeviceSteps d;
  uint64_t step_bytes = 0;
  int cycle = 0;
  if (!MakeDeviceSteps(tokens, reqs, &d, &step_bytes, &cycle)) return state.SkipWithError("inputs");
  int i = 0;
  for (auto _ : state) {
    const Step& s = d.steps[i];
    auto* p = static_cast<const int32_t*>(d.inputs[i]);
    DeviceStep step{p, p + s.tokens.size(), p + s.tokens.size() + s.qsl.size(),
                    static_cast<int64_t>(s.tokens.size()), static_cast<int64_t>(s.qsl.size()) - 1};
    if (!(*uva)->Enqueue(step, d.dst, nullptr).ok() ||
        !ferry::cuda::StreamSync(nullptr, ferry::Deadline()).ok())
      return state.SkipWithError("uva gather");
    if (!same_step) i = (i + 1) % cycle;
  }
  if (!(*uva)->CheckErrors().ok()) state.SkipWithError("uva errors");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(step_bytes));
  state.SetItemsProcessed(state.iterations() * tokens);
}

void CpuGatherCopy(benchmark::State& state) {
  const int tokens = static_cast<int>(state.range(0)), reqs = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  DeviceSteps d;
  uint64_t step_bytes = 0;
  int cycle = 0;
  if (!MakeDeviceSteps(tokens, reqs, &d, &step_bytes, &cycle)) return state.SkipWithError("inputs");
  std::vector<uint8_t> staging(step_bytes, 1);
  if (!ferry::cuda::HostRegister(staging.data(), staging.size()).ok())
    return state.SkipWithError("pin");
  auto gatherer = Gatherer::Create({.threads = threads}).value();
  int i = 0;
  for (auto _ : state) {
    if (!gatherer->GatherStep(BenchLayout(), BenchTable(), d.steps[i].input(), staging).ok() ||
        !ferry::cuda::CopySync(d.dst, staging.data(), staging.size()).ok())
      return state.SkipWithError("gather or copy");
    i = (i + 1) % cycle;
  }
  (void)ferry::cuda::HostUnregister(staging.data());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(step_bytes));
  state.SetItemsProcessed(state.iterations() * tokens);
}

// The baseline of the UVA gather: one copy of a step's bytes from page-locked host memory to the
// device buffer (what the link gives those bytes when nothing has to be gathered).
void PinnedCopy(benchmark::State& state) {
  const int tokens = static_cast<int>(state.range(0));
  const uint64_t step_bytes = uint64_t{16} * tokens * BenchTable().row_bytes();
  std::vector<uint8_t> host(step_bytes, 1);
  if (!ferry::cuda::HostRegister(host.data(), host.size()).ok()) return state.SkipWithError("pin");
  auto dst = ferry::cuda::Malloc(0, step_bytes);
  if (!dst.ok()) return state.SkipWithError("cudaMalloc");
  for (auto _ : state) {
    if (!ferry::cuda::CopySync(*dst, host.data(), host.size()).ok()) return state.SkipWithError("copy");
  }
  (void)ferry::cuda::Free(*dst);
  (void)ferry::cuda::HostUnregister(host.data());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(step_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (ferry::cuda::Available()) {
    for (auto [tokens, reqs] : {std::pair{8192, 8}, std::pair{256, 256}}) {
      const std::string shape =
          "/tokens:" + std::to_string(tokens) + "/reqs:" + std::to_string(reqs);
      benchmark::RegisterBenchmark(("pinned_copy" + shape).c_str(), PinnedCopy)
          ->Args({tokens, reqs})
          ->UseRealTime();
      benchmark::RegisterBenchmark(("uva_gather" + shape).c_str(), UvaGather)
          ->Args({tokens, reqs, 0})
          ->UseRealTime();
      benchmark::RegisterBenchmark(("uva_gather_same_step" + shape).c_str(), UvaGather)
          ->Args({tokens, reqs, 1})
          ->UseRealTime();
      for (int64_t t : ThreadCounts())
        benchmark::RegisterBenchmark(
            ("cpu_gather_copy" + shape + "/threads:" + std::to_string(t)).c_str(), CpuGatherCopy)
            ->Args({tokens, reqs, t})
            ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
