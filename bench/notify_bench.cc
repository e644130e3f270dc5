// The software cost of one notification hop over the shm transport, on one thread (no second
// core, no scheduler): where the time of a ping goes before any cache line crosses cores.
//   BM_RingPutTake      the ring alone: RingWriter::Put + RingReader::Take of one record
//   BM_EngineNotifyHop  Engine::Notify to a second engine of this process over shm, then that
//                       engine's PopNotifications until it has it (drained by Poll)
// Run by hand: build/release/bench/ferry_bench_notify (results: bench/results/shm_two_process.md).
#include <benchmark/benchmark.h>

#include "ferry/engine.h"
#include "transport/shm/ring.h"

namespace {

void BM_RingPutTake(benchmark::State& state) {
  auto reader = ferry::internal::shm::RingReader::Create(256 << 10, 64 << 10);
  if (!reader.ok()) return state.SkipWithError(reader.status().ToString().c_str());
  auto writer = ferry::internal::shm::RingWriter::Map((*reader)->fd(), (*reader)->capacity(),
                                                      (*reader)->max_message_bytes());
  if (!writer.ok()) return state.SkipWithError(writer.status().ToString().c_str());
  const std::string message = "ping 12345";
  bool wake = false;
  for (auto _ : state) {
    if (!(*writer)->Put(message, 0, false, &wake).ok()) return state.SkipWithError("put");
    auto t = (*reader)->Take(64);
    benchmark::DoNotOptimize(t.records.data());
  }
}
BENCHMARK(BM_RingPutTake);

void BM_EngineNotifyHop(benchmark::State& state) {
  ferry::EngineOptions o;
  o.transports = {"shm"};
  o.key = "bench-a";
  auto a = ferry::Engine::Create(o);
  o.key = "bench-b";
  auto b = ferry::Engine::Create(o);
  if (!a.ok() || !b.ok()) return state.SkipWithError("no shm engines here");
  if (!(*a)->AddPeer((*b)->Describe()).ok()) return state.SkipWithError("add peer");
  const std::string message = "ping 12345";
  if (!(*a)->Notify("bench-b", message).ok()) return state.SkipWithError("first notify");
  while ((*b)->PopNotifications().empty()) {
  }
  for (auto _ : state) {
    if (!(*a)->Notify("bench-b", message).ok()) return state.SkipWithError("notify");
    std::vector<ferry::Notification> got;
    while ((got = (*b)->PopNotifications()).empty()) {
    }
    benchmark::DoNotOptimize(got.data());
  }
}
BENCHMARK(BM_EngineNotifyHop);

}  // namespace

BENCHMARK_MAIN();
