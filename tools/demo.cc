// `ferry demo`: a prefill engine (producer) and a decode engine (consumer) move a KV cache layer
// by layer: one WriteBatch per layer, blocks scattered on both sides, a notification on the
// last layer's batch. The consumer checks that the notification arrived and then every byte,
// and the command prints throughput and per-layer latency. Both engines live in this process,
// or (--role) in two processes that find each other through a side channel: the consumer
// listens (--listen) and hands over its descriptors, the producer dials it (--peer).
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
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
#include "side_channel.h"
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

Result<DemoConfig> Configure(const DemoFlags& f) {
  DemoConfig c;
  c.shape.layers = f.layers;
  c.shape.blocks = f.blocks;
  FERRY_ASSIGN_OR_RETURN(c.shape.block_bytes, ParseBytes(f.block_bytes));
  FERRY_RETURN_IF_ERROR(c.shape.Validate());
  if (f.rounds == 0) return Status(Code::kInvalidArgument, "--rounds must be at least 1");
  FERRY_ASSIGN_OR_RETURN(c.kind, ParseMemoryKind(f.kind));
  FERRY_ASSIGN_OR_RETURN(c.alloc, ParseHostAlloc(f.alloc));
  if (c.alloc == HostAlloc::kShared && c.kind != MemoryKind::kHost)
    return Status(Code::kInvalidArgument, "--alloc shared needs --kind host");
  std::string reason;
  if (c.kind == MemoryKind::kCuda && !CudaAvailable(&reason))
    return Status(Code::kUnsupported, "--kind cuda: " + reason);
  c.device = c.kind == MemoryKind::kCuda ? f.device : -1;
  FERRY_ASSIGN_OR_RETURN(c.deadline, ParseSeconds(f.deadline_s, "--deadline"));
  FERRY_ASSIGN_OR_RETURN(Duration side, ParseSeconds(f.side_timeout_s, "--side-timeout"));
  c.side_timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(side));
  // Every layer's deadline, and 5 s for the notification; a day at most.
  const auto layers = static_cast<int64_t>(std::min<uint64_t>(c.shape.layers, INT64_MAX));
  c.notification_wait = c.deadline > Duration(kMaxFlagTime) / layers ? Duration(kMaxFlagTime)
                                                                      : c.deadline * layers + std::chrono::seconds(5);
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

// `listen`: the side channel's address, where the engine listens too (EngineListenHost).
Status MakeSide(const std::string& key, int copy_threads, const DemoConfig& c, Side* side,
                const std::vector<std::string>& transports = {}, const std::string& listen = "") {
  const uint64_t bytes = c.shape.total_bytes();
  FERRY_ASSIGN_OR_RETURN(side->buffer, Buffer::Allocate(c.kind, c.device, bytes, c.alloc));
  EngineOptions options;
  options.key = key;
  options.copy_threads = copy_threads;
  options.transports = transports;
  if (!listen.empty()) options.ucx.listen_host = EngineListenHost(listen, options.ucx.listen_host);
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

// ---- Two processes -----------------------------------------------------------------------

constexpr std::string_view kHello = "ferry-demo/1";

std::string ShapeLine(const DemoFlags& f, const DemoConfig& c) {
  return fmt::format("{} {} {} {} {} {}", c.shape.layers, c.shape.blocks, c.shape.block_bytes,
                     f.seed, f.rounds, f.kind);
}

// The consumer: serves its cache's descriptors, then for each round waits for the producer's
// notification, verifies every byte and reports back.
int RunConsumer(const DemoFlags& f, const DemoConfig& c) {
  Side consumer;
  if (Status s = MakeSide(fmt::format("demo-decode-{}", getpid()), f.threads, c, &consumer, f.transports, f.listen);
      !s.ok())
    return Fail(kCmd, s.WithContext("consumer"));
  auto listener = SideListener::Listen(f.listen);
  if (!listener.ok()) return Fail(kCmd, listener.status());
  fmt::print("ferry demo (consumer): {} of KV cache registered; side channel on {}\n",
             FormatBytes(c.shape.total_bytes()), (*listener)->address());
  fmt::print("ferry demo (consumer): waiting up to {} s for the producer (--side-timeout)\n",
             c.side_timeout.count() / 1e3);
  std::fflush(stdout);
  auto channel = (*listener)->Accept(c.side_timeout);
  if (!channel.ok()) return Fail(kCmd, channel.status());
  SideChannel& side = **channel;
  Status s = side.Send(kHello);
  if (s.ok()) s = side.Send(ShapeLine(f, c));
  if (s.ok()) s = side.Send(consumer.engine->Describe().Pack());
  if (s.ok()) s = side.Send(consumer.desc.Pack());
  auto producer_bytes = side.Receive(c.side_timeout);
  if (!s.ok() || !producer_bytes.ok()) return Fail(kCmd, s.ok() ? producer_bytes.status() : s);
  auto producer = EngineDesc::Unpack(*producer_bytes);
  if (!producer.ok()) return Fail(kCmd, producer.status().WithContext("producer descriptor"));
  if (Status added = consumer.engine->AddPeer(*producer); !added.ok()) return Fail(kCmd, added);

  const BlockMapping mapping = MakeBlockMapping(c.shape.blocks, f.seed);
  uint64_t bad_rounds = 0;
  for (uint64_t round = 0; round < f.rounds; ++round) {
    if (round > 0) {  // start from an empty cache, so stale data cannot pass the check
      std::vector<std::byte> zeros(c.shape.blocks * c.shape.block_bytes);
      for (uint64_t at = 0; at < c.shape.total_bytes(); at += zeros.size())
        if (Status z = consumer.buffer->Write(at, zeros); !z.ok()) return Fail(kCmd, z);
    }
    if (Status r = side.Send(fmt::format("ready {}", round)); !r.ok()) return Fail(kCmd, r);
    const std::string message = fmt::format("round {}: {} layers written", round, c.shape.layers);
    Status notified = AwaitNotification(*consumer.engine, producer->key, message, c.notification_wait);
    auto verified = VerifyConsumer(*consumer.buffer, c.shape, mapping);
    if (!verified.ok()) return Fail(kCmd, verified.status());
    bool ok = notified.ok() && verified->bad_words == 0;
    bad_rounds += ok ? 0 : 1;
    fmt::print("round {}: notification {}, {} {}\n", round, notified.ok() ? "received" : notified.ToString(),
               FormatBytes(verified->bytes_checked),
               verified->bad_words == 0 ? "verified" : fmt::format("checked, {} bad words", verified->bad_words));
    if (Status r = side.Send(fmt::format("verified {} {} {} {}", round, notified.ok() ? 1 : 0,
                                         verified->bad_words, verified->bytes_checked));
        !r.ok())
      return Fail(kCmd, r);
  }
  return bad_rounds == 0 ? 0 : 1;
}

// The producer: learns of the consumer through the side channel, then pushes every round.
int RunProducer(const DemoFlags& f, const DemoConfig& c) {
  fmt::print("ferry demo (producer): connecting to the consumer at {}, for up to {} s (--side-timeout)\n", f.peer,
             c.side_timeout.count() / 1e3);
  std::fflush(stdout);
  auto channel = SideChannel::Dial(f.peer, c.side_timeout);
  if (!channel.ok())
    return Fail(kCmd, channel.status().WithContext("no consumer answered at " + f.peer + " within --side-timeout"));
  SideChannel& side = **channel;
  auto hello = side.Receive(c.side_timeout);
  if (!hello.ok()) return Fail(kCmd, hello.status());
  if (*hello != kHello)
    return Fail(kCmd, Status(Code::kFailedPrecondition, f.peer + " is not a `ferry demo --role consumer`"));
  auto shape = side.Receive(c.side_timeout);
  auto engine_bytes = side.Receive(c.side_timeout);
  auto memory_bytes = side.Receive(c.side_timeout);
  if (!shape.ok() || !engine_bytes.ok() || !memory_bytes.ok())
    return Fail(kCmd, Status(Code::kUnavailable, "the consumer's descriptors did not arrive"));
  if (*shape != ShapeLine(f, c))
    return Fail(kCmd, Status(Code::kFailedPrecondition,
                             "the consumer's cache (" + *shape + ") differs from this one (" + ShapeLine(f, c) + ")"));
  auto peer = EngineDesc::Unpack(*engine_bytes);
  if (!peer.ok()) return Fail(kCmd, peer.status().WithContext("consumer engine descriptor"));
  auto remote = MemoryDesc::Unpack(*memory_bytes);
  if (!remote.ok()) return Fail(kCmd, remote.status().WithContext("consumer memory descriptor"));

  Side producer;
  // A consumer on another host reaches this engine too (read mode): listen on every interface
  // unless the consumer is on loopback.
  const bool local_peer = f.peer.rfind("127.", 0) == 0 || f.peer.rfind("localhost:", 0) == 0;
  if (Status s = MakeSide(fmt::format("demo-prefill-{}", getpid()), f.threads, c, &producer, f.transports,
                          local_peer ? "" : "0.0.0.0:0");
      !s.ok())
    return Fail(kCmd, s.WithContext("producer"));
  if (Status s = side.Send(producer.engine->Describe().Pack()); !s.ok()) return Fail(kCmd, s);
  if (Status s = producer.engine->AddPeer(*peer); !s.ok()) return Fail(kCmd, s);
  auto session = producer.engine->OpenSession(producer.desc, *remote);
  if (!session.ok()) return Fail(kCmd, session.status());
  if (Status s = FillProducer(*producer.buffer, c.shape); !s.ok()) return Fail(kCmd, s.WithContext("fill"));
  const BlockMapping mapping = MakeBlockMapping(c.shape.blocks, f.seed);
  std::vector<std::vector<TransferOp>> plans;
  for (uint64_t layer = 0; layer < c.shape.layers; ++layer) plans.push_back(PlanLayer(c.shape, mapping, layer));
  fmt::print("ferry demo (producer): two processes, path {}, {} ops per layer\n", session->path().ToString(),
             plans[0].size());

  Table table;
  for (const char* title : {"round", "GB/s", "ms", "layer median us", "layer p99 us", "notification", "verified"})
    table.AddColumn(title);
  std::vector<double> all_layer_us;
  double transfer_s = 0;
  uint64_t bad_rounds = 0;
  for (uint64_t round = 0; round < f.rounds; ++round) {
    auto ready = side.Receive(c.side_timeout);
    if (!ready.ok()) return Fail(kCmd, ready.status().WithContext("waiting for the consumer"));
    const std::string message = fmt::format("round {}: {} layers written", round, c.shape.layers);
    Progress progress(fmt::format("round {}", round), c.shape.layers);
    const Clock::time_point start = Clock::now();
    auto pushed = PushLayers(*session, plans, message, c.deadline, progress);
    const double seconds = Since(start);
    progress.Done();
    if (!pushed.ok()) return Fail(kCmd, pushed.status().WithContext(fmt::format("round {}", round)));
    auto report = side.Receive(c.side_timeout);
    if (!report.ok()) return Fail(kCmd, report.status().WithContext("waiting for the consumer's check"));
    uint64_t r = 0, notified = 0, bad = 0, checked = 0;
    if (std::sscanf(report->c_str(), "verified %lu %lu %lu %lu", &r, &notified, &bad, &checked) != 4)
      return Fail(kCmd, Status(Code::kInvalidArgument, "unexpected message from the consumer: " + *report));
    bad_rounds += (notified == 1 && bad == 0) ? 0 : 1;
    all_layer_us.insert(all_layer_us.end(), pushed->begin(), pushed->end());
    transfer_s += seconds;
    LatencySummary lat = Summarize(*pushed);
    table.AddRow({std::to_string(round),
                  fmt::format("{:.2f}", GigabytesPerSecond(static_cast<double>(c.shape.total_bytes()), seconds)),
                  fmt::format("{:.2f}", seconds * 1e3), Micros(lat.median_us), Micros(lat.p99_us),
                  notified == 1 ? "received" : "MISSING", bad == 0 ? FormatBytes(checked) : "MISMATCH"});
  }
  table.Print(stdout);
  LatencySummary lat = Summarize(all_layer_us);
  const double moved = static_cast<double>(c.shape.total_bytes() * f.rounds);
  fmt::print("total ({}): {} moved in {:.2f} ms = {:.2f} GB/s; per layer: median {} us, p99 {} us\n",
             session->path().ToString(), FormatBytes(c.shape.total_bytes() * f.rounds), transfer_s * 1e3,
             GigabytesPerSecond(moved, transfer_s), Micros(lat.median_us), Micros(lat.p99_us));
  if (bad_rounds != 0) {
    fmt::print("FAILED: {} of {} rounds did not verify at the consumer\n", bad_rounds, f.rounds);
    return 1;
  }
  fmt::print("OK: the consumer received the notification and verified every byte\n");
  return 0;
}

int Run(const DemoFlags& f) {
  auto config = Configure(f);
  if (!config.ok()) return Fail(kCmd, config.status());
  const DemoConfig& c = *config;
  if (f.role == "consumer") {
    if (f.listen.empty()) return Fail(kCmd, Status(Code::kInvalidArgument, "--role consumer needs --listen"));
    return RunConsumer(f, c);
  }
  if (f.role == "producer") {
    if (f.peer.empty()) return Fail(kCmd, Status(Code::kInvalidArgument, "--role producer needs --peer"));
    return RunProducer(f, c);
  }
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
  cmd->add_option("--alloc", f->alloc,
                  "Host caches from the heap, or shared (peers of this host map them: `shm`)")
      ->check(CLI::IsMember({"heap", "shared"}))
      ->capture_default_str();
  cmd->add_option("--device", f->device, "CUDA device for --kind cuda")->capture_default_str();
  cmd->add_option("--threads", f->threads, "Copy threads (0 = one per core, at most 8)")
      ->capture_default_str();
  cmd->add_option("--rounds", f->rounds, "Times the whole cache is sent and verified")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the block mapping")->capture_default_str();
  cmd->add_option("--deadline", f->deadline_s, "Seconds each layer's batch may take (at most a day)")
      ->capture_default_str();
  cmd->add_option("--side-timeout", f->side_timeout_s,
                  "Two processes: seconds each side waits for the other on the side channel (at most a day)")
      ->capture_default_str();
  cmd->add_flag("--per-layer", f->per_layer, "Print each layer's latency and GB/s");
  cmd->add_option("--role", f->role, "Two processes: this one is the producer or the consumer")
      ->check(CLI::IsMember({"producer", "consumer"}));
  cmd->add_option("--listen", f->listen, "Consumer: side channel address HOST:PORT (port 0 = any)");
  cmd->add_option("--peer", f->peer, "Producer: the consumer's side channel HOST:PORT");
  cmd->add_option("--transport", f->transports, "Transports the engines may use (default: all)");
  cmd->callback([f, exit_code] { *exit_code = Run(*f); });
}

}  // namespace ferry::tools
