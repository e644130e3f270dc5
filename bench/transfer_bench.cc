// Host-memory transfer benchmarks of the engine, side by side with the plain memcpy loop they
// must keep up with:
//  - host_write/{memcpy_loop,ferry,ferry_1thread}/<piece>: 256 MiB written in pieces of 4 KiB,
//    64 KiB and 1 MiB, scattered on the remote side (a shuffled order of slots). `ferry` uses
//    the default copy threads (one per core, at most 8); `ferry_1thread` copies on the posting
//    thread. Targets: ferry >= 0.8x memcpy_loop at every size, >= 1.3x at 1 MiB.
//  - post_batch/<bytes>: post a batch of 100,000 tiny ops and wait; time_per_op is CPU time.
//    validate_batch: the same batch failing OUT_OF_RANGE at its last op (every op validated,
//    nothing moves). Target: <= 100 ns per op.
//  - op_check/80000/{threads,one_thread}/{asleep,back_to_back}: the engine's copy and check of a
//    batch of 80,000 ops (what every Post does before any byte moves) on its checking threads,
//    and on the calling thread alone (slices under the parallel threshold); `asleep` waits 1 ms
//    between batches, so the checking threads have gone to sleep, as between a GPU path's
//    batches; wall time of the check alone.
// Run: build/<preset>/bench/ferry_bench_transfer (results in bench/results/transfer_host.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <thread>
#include <span>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/op_check.h"
#include "ferry/engine.h"

namespace {

constexpr uint64_t kTotalBytes = 256ull << 20;
constexpr uint64_t kTinyOps = 100'000;
constexpr double kMinTime = 0.5;

struct HostBuffer {
  explicit HostBuffer(uint64_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, bytes))), size(bytes) {
    if (data != nullptr) std::memset(data, 1, bytes);  // fault every page in before timing
  }
  ~HostBuffer() { std::free(data); }
  std::byte* data;
  uint64_t size;
};

// Two engines in this process, a buffer registered in each, a session from the first to the
// second. One rig per copy-thread setting, made on first use and kept for the whole run.
struct Rig {
  HostBuffer local{kTotalBytes};
  HostBuffer remote{kTotalBytes};
  std::unique_ptr<ferry::Engine> a, b;
  ferry::Session session;
  std::string error;
};

Rig* GetRig(int copy_threads) {
  static std::map<int, std::unique_ptr<Rig>> rigs;
  auto& rig = rigs[copy_threads];
  if (rig) return rig.get();
  rig = std::make_unique<Rig>();
  auto fail = [&](const ferry::Status& s) {
    rig->error = s.ToString();
    return rig.get();
  };
  if (rig->local.data == nullptr || rig->remote.data == nullptr)
    return fail(ferry::Status(ferry::Code::kResourceExhausted, "out of memory"));
  ferry::EngineOptions options;
  options.copy_threads = copy_threads;
  options.key = "bench-a-" + std::to_string(copy_threads);
  auto a = ferry::Engine::Create(options);
  if (!a.ok()) return fail(a.status());
  options.key = "bench-b-" + std::to_string(copy_threads);
  auto b = ferry::Engine::Create(options);
  if (!b.ok()) return fail(b.status());
  rig->a = std::move(a).value();
  rig->b = std::move(b).value();
  if (auto s = rig->a->AddPeer(rig->b->Describe()); !s.ok()) return fail(s);
  auto l = rig->a->RegisterMemory(rig->local.data, kTotalBytes);
  if (!l.ok()) return fail(l.status());
  auto r = rig->b->RegisterMemory(rig->remote.data, kTotalBytes);
  if (!r.ok()) return fail(r.status());
  auto session = rig->a->OpenSession(*l, *r);
  if (!session.ok()) return fail(session.status());
  rig->session = *session;
  return rig.get();
}

// `count` pieces of `piece` bytes spaced `stride` apart: piece i at local slot i and at a
// shuffled remote slot.
std::vector<ferry::TransferOp> ScatteredOps(uint64_t count, uint64_t piece, uint64_t stride) {
  std::vector<uint64_t> slot(count);
  std::iota(slot.begin(), slot.end(), 0);
  std::mt19937_64 rng(42);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<ferry::TransferOp> ops(count);
  for (uint64_t i = 0; i < count; ++i) ops[i] = {i * stride, slot[i] * stride, piece};
  return ops;
}

void SetPieceCounters(benchmark::State& state, uint64_t pieces) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kTotalBytes));
  // Seconds per piece (printed with an SI prefix, e.g. "1.2u" = 1.2 us).
  state.counters["time_per_piece"] = benchmark::Counter(
      static_cast<double>(pieces),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void MemcpyLoop(benchmark::State& state, uint64_t piece) {
  Rig* rig = GetRig(0);  // only its buffers
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  const auto ops = ScatteredOps(kTotalBytes / piece, piece, piece);
  std::byte* src = rig->local.data;
  std::byte* dst = rig->remote.data;
  for (auto _ : state) {
    for (const ferry::TransferOp& op : ops)
      std::memcpy(dst + op.remote_offset, src + op.local_offset, op.size);
    benchmark::ClobberMemory();
  }
  SetPieceCounters(state, ops.size());
}

void FerryWrite(benchmark::State& state, uint64_t piece, int copy_threads) {
  Rig* rig = GetRig(copy_threads);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  const auto ops = ScatteredOps(kTotalBytes / piece, piece, piece);
  for (auto _ : state) {
    ferry::Status s = rig->session.WriteBatch(ops).Wait();
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  SetPieceCounters(state, ops.size());
}

// 100,000 ops of `piece` bytes, 64 bytes apart, scattered; the whole batch posted and waited.
void PostBatch(benchmark::State& state, uint64_t piece) {
  Rig* rig = GetRig(0);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  const auto ops = ScatteredOps(kTinyOps, piece, 64);
  for (auto _ : state) {
    ferry::Status s = rig->session.WriteBatch(ops).Wait();
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.counters["time_per_op"] = benchmark::Counter(
      static_cast<double>(kTinyOps),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The same batch with its last op out of range: validation runs over every op, nothing moves.
void ValidateBatch(benchmark::State& state) {
  Rig* rig = GetRig(0);
  if (!rig->error.empty()) return state.SkipWithError(rig->error.c_str());
  auto ops = ScatteredOps(kTinyOps, 8, 64);
  ops.back().remote_offset = kTotalBytes;  // one past the end
  for (auto _ : state) {
    ferry::Transfer t = rig->session.WriteBatch(ops);
    ferry::Status s = t.Wait();
    if (s.code() != ferry::Code::kOutOfRange)
      return state.SkipWithError(("expected OUT_OF_RANGE, got " + s.ToString()).c_str());
  }
  state.counters["time_per_op"] = benchmark::Counter(
      static_cast<double>(kTinyOps),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The engine's copy and check of 80,000 ops of 16 KiB scattered over 1.3 GB regions.
void OpCheckBatch(benchmark::State& state, bool threads, bool asleep) {
  constexpr size_t kOps = 80'000;
  constexpr uint64_t kPiece = 16 << 10, kRegion = kOps * kPiece;
  std::vector<ferry::TransferOp> ops(kOps), out(kOps);
  std::vector<uint64_t> slots(kOps);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(7));
  for (size_t i = 0; i < kOps; ++i) ops[i] = ferry::TransferOp{i * kPiece, slots[i] * kPiece, kPiece};
  const size_t slice = threads ? kOps : ferry::internal::kParallelCheckOps - 1;
  for (auto _ : state) {
    if (asleep) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto start = std::chrono::steady_clock::now();
    bool ok = true;
    for (size_t at = 0; at < kOps; at += slice) {
      const size_t n = std::min(slice, kOps - at);
      ok &= ferry::internal::CopyAndCheckOps(std::span(ops).subspan(at, n), out.data() + at, kRegion, kRegion).ok;
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!ok) return state.SkipWithError("the check failed a batch inside its regions");
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["time_per_op"] = benchmark::Counter(
      static_cast<double>(kOps), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

std::string SizeName(uint64_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB"
                             : std::to_string(bytes >> 10) + "KiB";
}

void RegisterAll() {
  for (uint64_t piece : {4ull << 10, 64ull << 10, 1ull << 20}) {
    const std::string size = SizeName(piece);
    benchmark::RegisterBenchmark(("host_write/memcpy_loop/" + size).c_str(), MemcpyLoop, piece)
        ->UseRealTime()
        ->MinTime(kMinTime)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("host_write/ferry/" + size).c_str(), FerryWrite, piece, 0)
        ->UseRealTime()
        ->MinTime(kMinTime)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("host_write/ferry_1thread/" + size).c_str(), FerryWrite, piece, 1)
        ->UseRealTime()
        ->MinTime(kMinTime)
        ->Unit(benchmark::kMillisecond);
  }
  // CPU time of the posting thread: 8-byte ops stay under parallel_copy_bytes (copied inline);
  // 16-byte ops (1.6 MB) take the thread pool, so their copy runs on the copy threads.
  for (uint64_t piece : {8ull, 16ull}) {
    benchmark::RegisterBenchmark(("post_batch/100000x" + std::to_string(piece) + "B").c_str(),
                                 PostBatch, piece)
        ->MinTime(kMinTime)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("validate_batch/100000_out_of_range", ValidateBatch)
      ->MinTime(kMinTime)
      ->Unit(benchmark::kMicrosecond);
  for (bool asleep : {true, false}) {
    for (bool threads : {true, false}) {
      const std::string name = std::string("op_check/80000/") + (threads ? "threads/" : "one_thread/") +
                               (asleep ? "asleep" : "back_to_back");
      benchmark::RegisterBenchmark(name.c_str(), OpCheckBatch, threads, asleep)
          ->UseManualTime()
          ->MinTime(kMinTime)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
