// `ferry demo`'s parts shared by its one-process run (demo.cc) and its two-process roles
// (demo_roles.cc): the flags and their checked form, one side's engine and KV cache, the
// layer pushes, the wait for the last layer's notification, and the JSON rows of rounds.
//
// Thread safety: none; the demo runs on one thread (the engines' own threads aside).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "buffers.h"
#include "ferry/engine.h"
#include "json_out.h"
#include "kv_fill.h"
#include "kv_layout.h"
#include "report.h"

namespace ferry::tools {

inline constexpr std::string_view kDemoCmd = "demo";

struct DemoFlags {
  uint64_t layers = 32;
  uint64_t blocks = 512;
  std::string block_bytes = "32K";
  std::string kind = "host";
  std::string alloc = "heap";
  int device = 0;
  int threads = 0;
  uint64_t rounds = 1;
  uint64_t seed = 7;
  double deadline_s = 30;
  double side_timeout_s = 120;
  bool per_layer = false;
  std::string role;    // "", "producer" or "consumer"
  std::string listen;  // consumer: side channel address
  std::string peer;    // producer: the consumer's side channel address
  std::vector<std::string> transports;
  JsonFlag json;
};

// The flags, checked and parsed.
struct DemoConfig {
  KvShape shape;
  MemoryKind kind = MemoryKind::kHost;
  HostAlloc alloc = HostAlloc::kHeap;
  int device = -1;
  Duration deadline{};
  // Two processes: how long each side waits for the other through the side channel, and how
  // long the consumer waits for a round's notification.
  std::chrono::milliseconds side_timeout{};
  Duration notification_wait{};
};

// Every flag checked, the roles' flags among them (--listen is the consumer's, --peer the
// producer's), before any engine starts. kInvalidArgument names the flag.
Result<DemoConfig> Configure(const DemoFlags& f);

// One side of the demo: an engine with its registered KV cache.
struct Side {
  std::unique_ptr<Buffer> buffer;  // declared first: freed after the engine is gone
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
  bool registered = false;
  ~Side() {
    if (registered) DeregisterAndFree(*engine, desc, buffer);
  }
};

// `listen`: the side channel's address, where the engine listens too (EngineListenHost).
// `metrics`: false leaves out the /metrics endpoint FERRY_METRICS_PORT asks for (the second
// engine of one process: a fixed port fits one).
Status MakeSide(const std::string& key, int copy_threads, const DemoConfig& c, Side* side,
                const std::vector<std::string>& transports = {}, const std::string& listen = "",
                bool metrics = true);

// Waits (up to `timeout`) for `message` from `from` among the consumer's notifications.
Status AwaitNotification(Engine& consumer, const std::string& from, const std::string& message, Duration timeout);

// Pushes every layer, one WriteBatch each, timing each from post to completion; the last batch
// carries `notification`.
Result<std::vector<double>> PushLayers(const Session& session, const std::vector<std::vector<TransferOp>>& plans,
                                       const std::string& notification, Duration deadline, Progress& progress);

// The message that the last layer's batch of `round` carries.
std::string RoundMessage(uint64_t round, const KvShape& shape);

// The layer times that describe the steady state: every round's but the first when there are
// several (the first pays for connections, registration caches and page faults: its p99 is
// the first layer's warm-up), the only round's otherwise. `all_layer_us`: `layers` times per
// round, round after round.
std::vector<double> SteadyLayers(const std::vector<double>& all_layer_us, uint64_t layers, uint64_t rounds);
// What the totals' per-layer figures cover, for the text: "rounds 1..4, after round 0's
// warm-up (its p99 812 us)", or "one round, warm-up included: --rounds N for steady figures".
std::string SteadyNote(const std::vector<double>& all_layer_us, uint64_t layers, uint64_t rounds);

// "12.3" or "1234": microseconds for the tables.
std::string DemoMicros(double us);

// One round in the JSON report. `layer_us` may be empty (the consumer does not time layers).
nlohmann::ordered_json RoundJson(uint64_t round, const KvShape& shape, double seconds,
                                 std::vector<double> layer_us, bool notified, uint64_t bytes_checked,
                                 uint64_t bad_words);
// The document: the cache's shape, where it ran, the rounds and (when timed) the totals.
nlohmann::ordered_json DemoJson(const DemoFlags& f, const DemoConfig& c, std::string_view role, std::string_view path,
                                nlohmann::ordered_json rounds, double transfer_s, std::vector<double> all_layer_us);

// The two processes (demo_roles.cc): the consumer serves its cache's descriptors on --listen
// and checks each round; the producer dials --peer and pushes every round.
int RunConsumer(const DemoFlags& f, const DemoConfig& c);
int RunProducer(const DemoFlags& f, const DemoConfig& c);

}  // namespace ferry::tools
