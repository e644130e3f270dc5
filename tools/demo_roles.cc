// `ferry demo --role consumer|producer`: the demo in two processes that find each other
// through a side channel. The consumer listens (--listen) and hands over its descriptors; the
// producer dials it (--peer), pushes every round and reports; the consumer checks each round's
// notification and every byte and sends its verdict back.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "demo.h"
#include "side_channel.h"
#include "units.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kCmd = kDemoCmd;
constexpr std::string_view kHello = "ferry-demo/1";

std::string ShapeLine(const DemoFlags& f, const DemoConfig& c) {
  return fmt::format("{} {} {} {} {} {}", c.shape.layers, c.shape.blocks, c.shape.block_bytes, f.seed, f.rounds,
                     f.kind);
}

}  // namespace

int RunConsumer(const DemoFlags& f, const DemoConfig& c) {
  std::FILE* out = TextStream(f.json);
  Side consumer;
  if (Status s = MakeSide(fmt::format("demo-decode-{}", getpid()), f.threads, c, &consumer, f.transports, f.listen);
      !s.ok())
    return Fail(kCmd, s.WithContext("consumer"));
  auto listener = SideListener::Listen(f.listen);
  if (!listener.ok()) return Fail(kCmd, listener.status());
  fmt::print(out, "ferry demo (consumer): {} of KV cache registered; side channel on {}\n",
             FormatBytes(c.shape.total_bytes()), (*listener)->address());
  fmt::print(out, "ferry demo (consumer): waiting up to {} s for the producer (--side-timeout)\n",
             c.side_timeout.count() / 1e3);
  std::fflush(out);
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
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (uint64_t round = 0; round < f.rounds; ++round) {
    if (round > 0) {  // start from an empty cache, so stale data cannot pass the check
      std::vector<std::byte> zeros(c.shape.blocks * c.shape.block_bytes);
      for (uint64_t at = 0; at < c.shape.total_bytes(); at += zeros.size())
        if (Status z = consumer.buffer->Write(at, zeros); !z.ok()) return Fail(kCmd, z);
    }
    if (Status r = side.Send(fmt::format("ready {}", round)); !r.ok()) return Fail(kCmd, r);
    Status notified =
        AwaitNotification(*consumer.engine, producer->key, RoundMessage(round, c.shape), c.notification_wait);
    auto verified = VerifyConsumer(*consumer.buffer, c.shape, mapping);
    if (!verified.ok()) return Fail(kCmd, verified.status());
    bool ok = notified.ok() && verified->bad_words == 0;
    bad_rounds += ok ? 0 : 1;
    fmt::print(out, "round {}: notification {}, {} {}\n", round, notified.ok() ? "received" : notified.ToString(),
               FormatBytes(verified->bytes_checked),
               verified->bad_words == 0 ? "verified" : fmt::format("checked, {} bad words", verified->bad_words));
    std::fflush(out);
    rounds.push_back(RoundJson(round, c.shape, 0, {}, notified.ok(), verified->bytes_checked, verified->bad_words));
    if (Status r = side.Send(fmt::format("verified {} {} {} {}", round, notified.ok() ? 1 : 0, verified->bad_words,
                                         verified->bytes_checked));
        !r.ok())
      return Fail(kCmd, r);
  }
  if (Status w = WriteJson(f.json, DemoJson(f, c, "consumer", "", std::move(rounds), 0, {})); !w.ok())
    return Fail(kCmd, w);
  return bad_rounds == 0 ? 0 : 1;
}

int RunProducer(const DemoFlags& f, const DemoConfig& c) {
  std::FILE* out = TextStream(f.json);
  // Dialling a consumer that is not there is silent until the timeout: say what it waits for.
  fmt::print(stderr, "ferry demo (producer): connecting to the consumer at {}, for up to {} s (--side-timeout)\n",
             f.peer, c.side_timeout.count() / 1e3);
  std::fflush(stderr);
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
  fmt::print(out, "ferry demo (producer): two processes, path {}, {} ops per layer\n", session->path().ToString(),
             plans[0].size());

  Table table;
  for (const char* title : {"round", "GB/s", "ms", "layer median us", "layer p99 us", "notification", "verified"})
    table.AddColumn(title);
  std::vector<double> all_layer_us;
  double transfer_s = 0;
  uint64_t bad_rounds = 0;
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (uint64_t round = 0; round < f.rounds; ++round) {
    auto ready = side.Receive(c.side_timeout);
    if (!ready.ok()) return Fail(kCmd, ready.status().WithContext("waiting for the consumer"));
    Progress progress(fmt::format("round {}", round), c.shape.layers);
    const Clock::time_point start = Clock::now();
    auto pushed = PushLayers(*session, plans, RoundMessage(round, c.shape), c.deadline, progress);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
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
    rounds.push_back(RoundJson(round, c.shape, seconds, *pushed, notified == 1, checked, bad));
    LatencySummary lat = Summarize(*pushed);
    table.AddRow({std::to_string(round),
                  fmt::format("{:.2f}", GigabytesPerSecond(static_cast<double>(c.shape.total_bytes()), seconds)),
                  fmt::format("{:.2f}", seconds * 1e3), DemoMicros(lat.median_us), DemoMicros(lat.p99_us),
                  notified == 1 ? "received" : "MISSING", bad == 0 ? FormatBytes(checked) : "MISMATCH"});
  }
  table.Print(out);
  const std::string path = session->path().ToString();
  if (Status w = WriteJson(f.json, DemoJson(f, c, "producer", path, std::move(rounds), transfer_s, all_layer_us));
      !w.ok())
    return Fail(kCmd, w);
  std::vector<double> steady = SteadyLayers(all_layer_us, c.shape.layers, f.rounds);
  LatencySummary lat = Summarize(steady);
  const double moved = static_cast<double>(c.shape.total_bytes() * f.rounds);
  fmt::print(out, "total ({}): {} moved in {:.2f} ms = {:.2f} GB/s; per layer: median {} us, p99 {} us over {}\n",
             path, FormatBytes(c.shape.total_bytes() * f.rounds), transfer_s * 1e3,
             GigabytesPerSecond(moved, transfer_s), DemoMicros(lat.median_us), DemoMicros(lat.p99_us),
             SteadyNote(all_layer_us, c.shape.layers, f.rounds));
  if (bad_rounds != 0) {
    fmt::print(out, "FAILED: {} of {} rounds did not verify at the consumer\n", bad_rounds, f.rounds);
    return 1;
  }
  fmt::print(out, "OK: the consumer received the notification and verified every byte\n");
  return 0;
}

}  // namespace ferry::tools
