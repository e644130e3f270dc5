// `ferry demo`: two engines in this process play prefill (producer) and decode (consumer) and
// move a KV cache layer by layer: one WriteBatch per layer, blocks scattered on both sides, a
// notification on the last layer's batch. The consumer checks that the notification arrived
// and then every byte, and the command prints throughput and per-layer latency.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "buffers.h"
#include "commands.h"
#include "ferry/engine.h"
#include "ferry/system.h"
#include "kv_fill.h"
#include "kv_layout.h"
#include "report.h"
#include "units.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kCmd = "demo";

struct DemoFlags {
  uint64_t layers = 32;
  uint64_t blocks = 512;
  std::string block_bytes = "32K";
  std::string kind = "host";
  int device = 0;
  int threads = 0;
  uint64_t rounds = 1;
  uint64_t seed = 7;
  double deadline_s = 30;
  bool per_layer = false;
};

// The flags, checked and parsed.
struct DemoConfig {
  KvShape shape;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  Duration deadline{};
};

Result<DemoConfig> Configure(const DemoFlags& f) {
  DemoConfig c;
  c.shape.layers = f.layers;
  c.shape.blocks = f.blocks;
  FERRY_ASSIGN_OR_RETURN(c.shape.block_bytes, ParseBytes(f.block_bytes));
  FERRY_RETURN_IF_ERROR(c.shape.Validate());
  if (f.rounds == 0) return Status(Code::kInvalidArgument, "--rounds must be at least 1");
  FERRY_ASSIGN_OR_RETURN(c.kind, ParseMemoryKind(f.kind));
  std::string reason;
  if (c.kind == MemoryKind::kCuda && !CudaAvailable(&reason))
    return Status(Code::kUnsupported, "--kind cuda: " + reason);
  c.device = c.kind == MemoryKind::kCuda ? f.device : -1;
  c.deadline = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(f.deadline_s));
  if (c.deadline <= Duration::zero())
    return Status(Code::kInvalidArgument, "--deadline must be positive");
  return c;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Micros(double us) {
  return us < 1000 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us);
}

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

Status MakeSide(const std::string& key, int copy_threads, const DemoConfig& c, Side* side) {
  const uint64_t bytes = c.shape.total_bytes();
  FERRY_ASSIGN_OR_RETURN(side->buffer, Buffer::Allocate(c.kind, c.device, bytes));
  EngineOptions options;
  options.key = key;
  options.copy_threads = copy_threads;
  FERRY_ASSIGN_OR_RETURN(side->engine, Engine::Create(options));
  FERRY_ASSIGN_OR_RETURN(
      side->desc, side->engine->RegisterMemory(side->buffer->data(), bytes, c.kind, c.device));
  side->registered = true;
  return Status::Ok();
}

// The producer learns of the consumer from bytes, as through any side channel, and opens a
// session to the consumer's cache.
Result<Session> Connect(Side& producer, const Side& consumer) {
  FERRY_ASSIGN_OR_RETURN(EngineDesc peer, EngineDesc::Unpack(consumer.engine->Describe().Pack()));
  FERRY_ASSIGN_OR_RETURN(MemoryDesc remote, MemoryDesc::Unpack(consumer.desc.Pack()));
  FERRY_RETURN_IF_ERROR(producer.engine->AddPeer(peer));
  return producer.engine->OpenSession(producer.desc, remote);
}

// Waits (up to `timeout`) for `message` from `from` among the consumer's notifications.
Status AwaitNotification(Engine& consumer, const std::string& from, const std::string& message,
                         Duration timeout) {
  const auto until = Clock::now() + timeout;
  std::vector<std::string> others;
  for (;;) {
    for (const Notification& n : consumer.PopNotifications()) {
      if (n.from == from && n.message == message) return Status::Ok();
      others.push_back(fmt::format("'{}' from {}", n.message, n.from));
    }
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return Status(
      Code::kDeadlineExceeded,
      fmt::format("notification '{}' did not arrive (got: {})", message,
                  others.empty() ? "nothing" : fmt::format("{}", fmt::join(others, ", "))));
}

// Pushes every layer, one WriteBatch each, timing each from post to completion; the last batch
// carries `notification`.
Result<std::vector<double>> PushLayers(const Session& session,
                                       const std::vector<std::vector<TransferOp>>& plans,
                                       const std::string& notification, Duration deadline,
                                       Progress& progress) {
  std::vector<double> layer_us;
  for (size_t layer = 0; layer < plans.size(); ++layer) {
    TransferOptions options;
    options.deadline = deadline;
    if (layer + 1 == plans.size()) options.notification = notification;
    const Clock::time_point posted = Clock::now();
    Status s = session.WriteBatch(plans[layer], options).Wait();  // bounded by the deadline
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - posted).count();
    if (!s.ok()) return s.WithContext(fmt::format("layer {}", layer));
    layer_us.push_back(us);
    progress.Step(fmt::format("layer {}", layer));
  }
  return layer_us;
}

struct RoundReport {
  std::vector<double> layer_us;
  double seconds = 0;
  Status notified;
  VerifyReport verified;
  bool ok() const { return notified.ok() && verified.bad_words == 0; }
};

// Sends the whole cache once into an empty consumer cache, then checks the notification and
// every byte. Returns an error only when the demo cannot go on (a failed transfer or copy);
// a missing notification or a mismatch is reported in the RoundReport.
Result<RoundReport> RunRound(uint64_t round, const DemoConfig& c, const Session& session,
                             const std::vector<std::vector<TransferOp>>& plans,
                             const BlockMapping& mapping, Side& producer, Side& consumer) {
  if (round > 0) {  // start from an empty consumer cache, so stale data cannot pass the check
    std::vector<std::byte> zeros(c.shape.blocks * c.shape.block_bytes);
    for (uint64_t at = 0; at < c.shape.total_bytes(); at += zeros.size())
      FERRY_RETURN_IF_ERROR(consumer.buffer->Write(at, zeros));
  }
  RoundReport r;
  const std::string message = fmt::format("round {}: {} layers written", round, c.shape.layers);
  Progress progress(fmt::format("round {}", round), c.shape.layers);
  const Clock::time_point start = Clock::now();
  auto pushed = PushLayers(session, plans, message, c.deadline, progress);
  r.seconds = Since(start);
  progress.Done();
  if (!pushed.ok()) return pushed.status();
  r.layer_us = std::move(pushed).value();
  r.notified =
      AwaitNotification(*consumer.engine, producer.engine->key(), message, std::chrono::seconds(5));
  FERRY_ASSIGN_OR_RETURN(r.verified, VerifyConsumer(*consumer.buffer, c.shape, mapping));
  return r;
}

void PrintLayers(uint64_t round, const KvShape& shape, const std::vector<double>& layer_us) {
  fmt::print("round {}, per layer:\n", round);
  Table table;
  for (const char* title : {"layer", "us", "GB/s"}) table.AddColumn(title);
  for (size_t l = 0; l < layer_us.size(); ++l) {
    double gbps = GigabytesPerSecond(static_cast<double>(shape.layer_bytes()), layer_us[l] * 1e-6);
    table.AddRow({std::to_string(l), Micros(layer_us[l]), fmt::format("{:.2f}", gbps)});
  }
  table.Print(stdout);
}

int Run(const DemoFlags& f) {
  auto config = Configure(f);
  if (!config.ok()) return Fail(kCmd, config.status());
  const DemoConfig& c = *config;
  const KvShape& shape = c.shape;
  const uint64_t total = shape.total_bytes();
  fmt::print(
      "ferry demo: KV cache of {} layers x 2 (K,V) x {} blocks x {} = {} per side, {} -> {}\n",
      shape.layers, shape.blocks, FormatBytes(shape.block_bytes), FormatBytes(total), f.kind,
      f.kind);

  Side producer, consumer;
  if (Status s = MakeSide("demo-prefill", f.threads, c, &producer); !s.ok())
    return Fail(kCmd, s.WithContext("producer"));
  if (Status s = MakeSide("demo-decode", f.threads, c, &consumer); !s.ok())
    return Fail(kCmd, s.WithContext("consumer"));
  auto session = Connect(producer, consumer);
  if (!session.ok()) return Fail(kCmd, session.status());

  const Clock::time_point fill_start = Clock::now();
  if (Status s = FillProducer(*producer.buffer, shape); !s.ok())
    return Fail(kCmd, s.WithContext("fill"));
  const double fill_s = Since(fill_start);
  const BlockMapping mapping = MakeBlockMapping(shape.blocks, f.seed);
  std::vector<std::vector<TransferOp>> plans;
  for (uint64_t layer = 0; layer < shape.layers; ++layer)
    plans.push_back(PlanLayer(shape, mapping, layer));
  fmt::print(
      "path {}, copy threads {}, {} ops per layer (blocks scattered on both sides); "
      "producer filled in {:.2f} s\n",
      session->path().ToString(), f.threads == 0 ? "auto" : std::to_string(f.threads),
      plans[0].size(), fill_s);

  Table table;
  for (const char* title : {"round", "GB/s", "ms", "layer median us", "layer p99 us",
                            "layer max us", "notification", "verified"})
    table.AddColumn(title);
  std::vector<double> all_layer_us;
  uint64_t bad_rounds = 0;
  double transfer_s = 0;
  for (uint64_t round = 0; round < f.rounds; ++round) {
    auto r = RunRound(round, c, *session, plans, mapping, producer, consumer);
    if (!r.ok()) return Fail(kCmd, r.status().WithContext(fmt::format("round {}", round)));
    if (!r->notified.ok())
      fmt::print(stderr, "ferry demo: round {}: {}\n", round, r->notified.ToString());
    if (r->verified.bad_words != 0) {
      fmt::print(stderr, "ferry demo: round {}: {} bad words in {} blocks; the first at {}\n",
                 round, r->verified.bad_words, r->verified.bad_blocks, r->verified.first_bad);
    }
    bad_rounds += r->ok() ? 0 : 1;
    if (f.per_layer) PrintLayers(round, shape, r->layer_us);
    all_layer_us.insert(all_layer_us.end(), r->layer_us.begin(), r->layer_us.end());
    transfer_s += r->seconds;
    LatencySummary lat = Summarize(r->layer_us);
    table.AddRow(
        {std::to_string(round),
         fmt::format("{:.2f}", GigabytesPerSecond(static_cast<double>(total), r->seconds)),
         fmt::format("{:.2f}", r->seconds * 1e3), Micros(lat.median_us), Micros(lat.p99_us),
         Micros(lat.max_us), r->notified.ok() ? "received" : "MISSING",
         r->verified.bad_words == 0 ? FormatBytes(r->verified.bytes_checked) : "MISMATCH"});
  }
  table.Print(stdout);

  LatencySummary lat = Summarize(all_layer_us);
  const double moved = static_cast<double>(total * f.rounds);
  fmt::print(
      "total: {} moved in {:.2f} ms = {:.2f} GB/s; per layer ({}): median {} us, "
      "p99 {} us = {:.2f} GB/s at the median\n",
      FormatBytes(total * f.rounds), transfer_s * 1e3, GigabytesPerSecond(moved, transfer_s),
      FormatBytes(shape.layer_bytes()), Micros(lat.median_us), Micros(lat.p99_us),
      GigabytesPerSecond(static_cast<double>(shape.layer_bytes()), lat.median_us * 1e-6));
  if (bad_rounds != 0) {
    fmt::print("FAILED: {} of {} rounds did not verify\n", bad_rounds, f.rounds);
    return 1;
  }
  fmt::print("OK: notification received and every byte verified\n");
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "demo", "Two engines move a KV cache layer by layer and verify every byte");
  auto f = std::make_shared<DemoFlags>();
  cmd->add_option("--layers", f->layers, "Layers")->capture_default_str();
  cmd->add_option("--blocks", f->blocks, "Blocks per layer, of K and of V")->capture_default_str();
  cmd->add_option("--block-bytes", f->block_bytes, "Bytes per block (a multiple of 8)")
      ->capture_default_str();
  cmd->add_option("--kind", f->kind, "Memory of both caches: host or cuda")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--device", f->device, "CUDA device for --kind cuda")->capture_default_str();
  cmd->add_option("--threads", f->threads, "Copy threads (0 = one per core, at most 8)")
      ->capture_default_str();
  cmd->add_option("--rounds", f->rounds, "Times the whole cache is sent and verified")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the block mapping")->capture_default_str();
  cmd->add_option("--deadline", f->deadline_s, "Seconds each layer's batch may take")
      ->capture_default_str();
  cmd->add_flag("--per-layer", f->per_layer, "Print each layer's latency and GB/s");
  cmd->callback([f, exit_code] { *exit_code = Run(*f); });
}

}  // namespace ferry::tools
