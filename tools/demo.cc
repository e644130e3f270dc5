// `ferry demo`: a prefill engine (producer) and a decode engine (consumer) move a KV cache layer
// by layer: one WriteBatch per layer, blocks scattered on both sides, a notification on the
// last layer's batch. The consumer checks that the notification arrived and then every byte,
// and the command prints throughput and per-layer latency. Both engines live in this process,
// or (--role) in two processes that find each other through a side channel: the consumer
// listens (--listen) and hands over its descriptors, the producer dials it (--peer) (demo_roles.cc).
// --json [FILE] writes the rounds and totals as JSON.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "demo.h"
#include "units.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kCmd = kDemoCmd;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The producer learns of the consumer from bytes, as through any side channel, and opens a
// session to the consumer's cache.
Result<Session> Connect(Side& producer, const Side& consumer) {
  FERRY_ASSIGN_OR_RETURN(EngineDesc peer, EngineDesc::Unpack(consumer.engine->Describe().Pack()));
  FERRY_ASSIGN_OR_RETURN(MemoryDesc remote, MemoryDesc::Unpack(consumer.desc.Pack()));
  FERRY_RETURN_IF_ERROR(producer.engine->AddPeer(peer));
  return producer.engine->OpenSession(producer.desc, remote);
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
  const std::string message = RoundMessage(round, c.shape);
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

void PrintLayers(std::FILE* out, uint64_t round, const KvShape& shape, const std::vector<double>& layer_us) {
  fmt::print(out, "round {}, per layer:\n", round);
  Table table;
  for (const char* title : {"layer", "us", "GB/s"}) table.AddColumn(title);
  for (size_t l = 0; l < layer_us.size(); ++l) {
    double gbps = GigabytesPerSecond(static_cast<double>(shape.layer_bytes()), layer_us[l] * 1e-6);
    table.AddRow({std::to_string(l), DemoMicros(layer_us[l]), fmt::format("{:.2f}", gbps)});
  }
  table.Print(out);
}

int Run(const DemoFlags& f) {
  auto config = Configure(f);
  if (!config.ok()) return Fail(kCmd, config.status());
  const DemoConfig& c = *config;
  if (f.role == "consumer") return RunConsumer(f, c);  // Configure checked --listen
  if (f.role == "producer") return RunProducer(f, c);  // and --peer
  std::FILE* out = TextStream(f.json);
  const KvShape& shape = c.shape;
  const uint64_t total = shape.total_bytes();
  fmt::print(out,
      "ferry demo: KV cache of {} layers x 2 (K,V) x {} blocks x {} = {} per side, {} -> {}\n",
      shape.layers, shape.blocks, FormatBytes(shape.block_bytes), FormatBytes(total), f.kind,
      f.kind);

  Side producer, consumer;
  if (Status s = MakeSide("demo-prefill", f.threads, c, &producer, f.transports); !s.ok())
    return Fail(kCmd, s.WithContext("producer"));
  if (Status s = MakeSide("demo-decode", f.threads, c, &consumer, f.transports, "", false); !s.ok())
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
  fmt::print(out,
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
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
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
    if (f.per_layer) PrintLayers(out, round, shape, r->layer_us);
    rounds.push_back(RoundJson(round, shape, r->seconds, r->layer_us, r->notified.ok(), r->verified.bytes_checked,
                               r->verified.bad_words));
    all_layer_us.insert(all_layer_us.end(), r->layer_us.begin(), r->layer_us.end());
    transfer_s += r->seconds;
    LatencySummary lat = Summarize(r->layer_us);
    table.AddRow(
        {std::to_string(round),
         fmt::format("{:.2f}", GigabytesPerSecond(static_cast<double>(total), r->seconds)),
         fmt::format("{:.2f}", r->seconds * 1e3), DemoMicros(lat.median_us), DemoMicros(lat.p99_us),
         DemoMicros(lat.max_us), r->notified.ok() ? "received" : "MISSING",
         r->verified.bad_words == 0 ? FormatBytes(r->verified.bytes_checked) : "MISMATCH"});
  }
  table.Print(out);
  if (Status w = WriteJson(f.json, DemoJson(f, c, "one process", session->path().ToString(), std::move(rounds),
                                            transfer_s, all_layer_us));
      !w.ok())
    return Fail(kCmd, w);

  std::vector<double> steady = SteadyLayers(all_layer_us, shape.layers, f.rounds);
  LatencySummary lat = Summarize(steady);
  const double moved = static_cast<double>(total * f.rounds);
  fmt::print(out,
      "total: {} moved in {:.2f} ms = {:.2f} GB/s; per layer ({}): median {} us, "
      "p99 {} us = {:.2f} GB/s at the median; per layer over {}\n",
      FormatBytes(total * f.rounds), transfer_s * 1e3, GigabytesPerSecond(moved, transfer_s),
      FormatBytes(shape.layer_bytes()), DemoMicros(lat.median_us), DemoMicros(lat.p99_us),
      GigabytesPerSecond(static_cast<double>(shape.layer_bytes()), lat.median_us * 1e-6),
      SteadyNote(all_layer_us, shape.layers, f.rounds));
  if (bad_rounds != 0) {
    fmt::print(out, "FAILED: {} of {} rounds did not verify\n", bad_rounds, f.rounds);
    return 1;
  }
  fmt::print(out, "OK: notification received and every byte verified\n");
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
  cmd->add_option("--rounds", f->rounds, "Times the whole cache is sent and verified; with 2 or more, the totals' per-layer figures leave out round 0 (warm-up)")
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
  cmd->add_option("--listen", f->listen,
                  "Consumer (--role consumer): side channel address HOST:PORT (port 0 = any)");
  cmd->add_option("--peer", f->peer, "Producer (--role producer): the consumer's side channel HOST:PORT");
  cmd->add_option("--transport", f->transports, "Transports the engines may use (default: all)");
  AddJsonFlag(cmd, &f->json, "Every round and the totals");
  cmd->callback([f, exit_code] { *exit_code = Run(*f); });
}

}  // namespace ferry::tools
