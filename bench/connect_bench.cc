// Connection set-up time, without and with authentication (EngineOptions::secret), over ucx
// (TCP loopback: UCX_TLS=tcp unless set) and shm, side by side in one run.
//
// What is timed, per iteration: a fresh initiator engine (created, and its 4 KiB buffer
// registered, before the clock starts) connects to a target engine that lives for the whole
// run: AddPeer(target) + OpenSession(local, target region) + the first 4 KiB write, waited
// for (data in place at the target). That is the connection coming up from nothing: the ucx
// door handshake (with a secret: the HMAC-SHA256 challenge-response both ways) and endpoint
// wire-up, or the shm socket hello (with a secret: the same challenge-response) and the
// mapping of the target's region, then one transfer over it. The initiator engine is destroyed
// after the clock stops: a connection cannot be torn down and rebuilt inside one engine (the
// engine keeps a peer's endpoint while sessions use it), so each iteration uses a fresh
// initiator, and engine creation and teardown are not timed. Counters split the time into its
// three steps (add_peer, open_session, first_write; means per iteration).
//
// After the google-benchmark output a summary prints, per transport, the median of every
// iteration of every repetition without and with the secret and their ratio
// (bench/results/connect.md).
// Run: build/<preset>/bench/ferry_bench_connect [--benchmark_repetitions=5]
//      [--benchmark_enable_random_interleaving=true]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/shared_memory.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBytes = 4096;
constexpr int kIterations = 20;
constexpr char kSecret[] = "connect-bench-secret-0123456789";

// The buffer is declared first: it is freed after the engine.
struct Side {
  ferry::HostBuffer buf;
  std::unique_ptr<ferry::Engine> engine;
  ferry::MemoryDesc desc;
};

ferry::Result<Side> MakeSide(const std::string& transport, bool secret, const std::string& key) {
  Side s;
  ferry::EngineOptions o;
  o.key = key;
  o.transports = {transport};
  if (secret) o.secret = kSecret;
  FERRY_ASSIGN_OR_RETURN(s.engine, ferry::Engine::Create(o));
  // Shared host memory: what shm reaches; ucx takes any host memory.
  FERRY_ASSIGN_OR_RETURN(s.buf, ferry::AllocateSharedHost(kBytes));
  std::memset(s.buf.data(), 0x5a, kBytes);
  FERRY_ASSIGN_OR_RETURN(s.desc, s.engine->RegisterMemory(s.buf.data(), kBytes));
  return s;
}

// One target per case, kept for the whole run (made on first use).
Side* Target(const std::string& transport, bool secret, std::string* error) {
  static std::map<std::string, std::unique_ptr<Side>> targets;
  const std::string name = transport + (secret ? "/secret" : "/none");
  auto& t = targets[name];
  if (t) return t.get();
  auto side = MakeSide(transport, secret, "connect-target-" + transport + (secret ? "-s" : "-n"));
  if (!side.ok()) {
    *error = side.status().ToString();
    targets.erase(name);
    return nullptr;
  }
  t = std::make_unique<Side>(std::move(side).value());
  return t.get();
}

// Every timed iteration's seconds, by transport and secret, for the summary.
std::map<std::string, std::map<bool, std::vector<double>>>& Samples() {
  static std::map<std::string, std::map<bool, std::vector<double>>> samples;
  return samples;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void Connect(benchmark::State& state, const std::string& transport, bool secret) {
  std::string error;
  Side* target = Target(transport, secret, &error);
  if (target == nullptr) return state.SkipWithError(error.c_str());
  double add_peer = 0, open_session = 0, first_write = 0;
  int n = 0;
  for (auto _ : state) {
    // Untimed: a fresh initiator (its own engine, listener and UCX worker).
    auto initiator = MakeSide(transport, secret, "connect-initiator-" + std::to_string(n++));
    if (!initiator.ok()) return state.SkipWithError(initiator.status().ToString().c_str());
    Side& from = *initiator;
    const auto t0 = Clock::now();
    ferry::Status s = from.engine->AddPeer(target->engine->Describe());
    if (!s.ok()) return state.SkipWithError(("AddPeer: " + s.ToString()).c_str());
    const auto t1 = Clock::now();
    auto session = from.engine->OpenSession(from.desc, target->desc);
    if (!session.ok()) return state.SkipWithError(("OpenSession: " + session.status().ToString()).c_str());
    const auto t2 = Clock::now();
    s = session->Write(0, 0, kBytes).Wait();
    if (!s.ok()) return state.SkipWithError(("first write: " + s.ToString()).c_str());
    const auto t3 = Clock::now();
    state.SetIterationTime(Seconds(t3 - t0));
    add_peer += Seconds(t1 - t0);
    open_session += Seconds(t2 - t1);
    first_write += Seconds(t3 - t2);
    Samples()[transport][secret].push_back(Seconds(t3 - t0));
    // Untimed: the session and the initiator engine go away at the end of the scope.
  }
  if (n == 0) return;
  auto mean = [&](double total) { return benchmark::Counter(total / n); };
  state.counters["add_peer_s"] = mean(add_peer);
  state.counters["open_session_s"] = mean(open_session);
  state.counters["first_write_s"] = mean(first_write);
  if (secret && target->engine->stats().auth_failures != 0)
    state.SkipWithError("the target counted authentication failures");
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

void PrintSummary() {
  std::printf("\nconnection set-up, median of all iterations (ms):\n");
  std::printf("| transport | no secret | secret | secret / no secret | iterations |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& [transport, by_secret] : Samples()) {
    auto none = by_secret.find(false), with = by_secret.find(true);
    if (none == by_secret.end() || with == by_secret.end()) continue;
    double a = Median(none->second), b = Median(with->second);
    std::printf("| %s | %.3f | %.3f | %.2f | %zu / %zu |\n", transport.c_str(), a * 1e3, b * 1e3,
                a > 0 ? b / a : 0.0, none->second.size(), with->second.size());
  }
}

void RegisterAll() {
  for (const char* transport : {"ucx", "shm"}) {
    for (bool secret : {false, true}) {
      std::string name = std::string("connect/") + transport + (secret ? "/secret" : "/no_secret");
      benchmark::RegisterBenchmark(name.c_str(), Connect, std::string(transport), secret)
          ->UseManualTime()
          ->Iterations(kIterations)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // TCP loopback for ucx, as between two hosts without RDMA (a value already set is kept).
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  PrintSummary();
  return 0;
}
