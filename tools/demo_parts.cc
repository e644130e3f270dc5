// `ferry demo`'s shared parts (demo.h).
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "demo.h"
#include "ferry/system.h"
#include "side_channel.h"
#include "transport_flag.h"
#include "units.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;

// --role, --listen and --peer go together: a --listen or --peer without the role that uses it
// would otherwise run the one-process demo and ignore them.
Status CheckRole(const DemoFlags& f) {
  auto invalid = [](std::string what) { return Status(Code::kInvalidArgument, std::move(what)); };
  if (f.role.empty()) {
    if (!f.listen.empty()) return invalid("--listen is the consumer's side channel: add --role consumer");
    if (!f.peer.empty()) return invalid("--peer is the consumer the producer dials: add --role producer");
    return Status::Ok();
  }
  if (f.role == "consumer") {
    if (f.listen.empty()) return invalid("--role consumer needs --listen");
    if (!f.peer.empty()) return invalid("--peer is the producer's: the consumer listens (--listen)");
    return Status::Ok();
  }
  if (f.peer.empty()) return invalid("--role producer needs --peer");
  if (!f.listen.empty()) return invalid("--listen is the consumer's: the producer dials it (--peer)");
  return Status::Ok();
}

}  // namespace

Result<DemoConfig> Configure(const DemoFlags& f) {
  FERRY_RETURN_IF_ERROR(CheckRole(f));
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
  FERRY_RETURN_IF_ERROR(CheckTransportFlag(f.transports));
  if (c.kind == MemoryKind::kHost)
    FERRY_RETURN_IF_ERROR(CheckTransportAlloc(f.transports, c.alloc == HostAlloc::kShared));
  FERRY_RETURN_IF_ERROR(CheckJsonTarget(f.json));
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

Status MakeSide(const std::string& key, int copy_threads, const DemoConfig& c, Side* side,
                const std::vector<std::string>& transports, const std::string& listen, bool metrics) {
  const uint64_t bytes = c.shape.total_bytes();
  FERRY_ASSIGN_OR_RETURN(side->buffer, Buffer::Allocate(c.kind, c.device, bytes, c.alloc));
  // From the environment (FERRY_*, docs/configuration.md); the flags, where they say more than
  // their defaults (0 threads: the engine's choice; no --transport: all), override it. The key
  // is always the side's: the two engines of one process need two.
  FERRY_ASSIGN_OR_RETURN(EngineOptions options, EngineOptions::FromEnv());
  options.key = key;
  if (copy_threads != 0) options.copy_threads = copy_threads;
  if (!transports.empty()) options.transports = transports;
  if (!metrics) options.metrics_port = 0;
  if (!listen.empty()) options.ucx.listen_host = EngineListenHost(listen, options.ucx.listen_host);
  FERRY_ASSIGN_OR_RETURN(side->engine, Engine::Create(options));
  FERRY_ASSIGN_OR_RETURN(side->desc, side->engine->RegisterMemory(side->buffer->data(), bytes, c.kind, c.device));
  side->registered = true;
  return Status::Ok();
}

Status AwaitNotification(Engine& consumer, const std::string& from, const std::string& message, Duration timeout) {
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
  return Status(Code::kDeadlineExceeded,
                fmt::format("notification '{}' did not arrive (got: {})", message,
                            others.empty() ? "nothing" : fmt::format("{}", fmt::join(others, ", "))));
}

Result<std::vector<double>> PushLayers(const Session& session, const std::vector<std::vector<TransferOp>>& plans,
                                       const std::string& notification, Duration deadline, Progress& progress) {
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

std::string RoundMessage(uint64_t round, const KvShape& shape) {
  return fmt::format("round {}: {} layers written", round, shape.layers);
}

std::string DemoMicros(double us) { return us < 1000 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us); }

nlohmann::ordered_json RoundJson(uint64_t round, const KvShape& shape, double seconds, std::vector<double> layer_us,
                                 bool notified, uint64_t bytes_checked, uint64_t bad_words) {
  nlohmann::ordered_json r = {{"round", round}};
  if (!layer_us.empty()) {
    const LatencySummary lat = Summarize(layer_us);
    r["seconds"] = seconds;
    r["gbps"] = GigabytesPerSecond(static_cast<double>(shape.total_bytes()), seconds);
    r["layer_us"] = {{"median", lat.median_us}, {"p99", lat.p99_us}, {"max", lat.max_us}, {"mean", lat.mean_us}};
  }
  r["notification_received"] = notified;
  r["bytes_checked"] = bytes_checked;
  r["bad_words"] = bad_words;
  r["verified"] = notified && bad_words == 0;
  return r;
}

std::vector<double> SteadyLayers(const std::vector<double>& all_layer_us, uint64_t layers, uint64_t rounds) {
  if (rounds < 2 || all_layer_us.size() <= layers) return all_layer_us;
  return std::vector<double>(all_layer_us.begin() + static_cast<std::ptrdiff_t>(layers), all_layer_us.end());
}

std::string SteadyNote(const std::vector<double>& all_layer_us, uint64_t layers, uint64_t rounds) {
  if (rounds < 2 || all_layer_us.size() <= layers) return "one round, warm-up included: --rounds N for steady figures";
  std::vector<double> first(all_layer_us.begin(), all_layer_us.begin() + static_cast<std::ptrdiff_t>(layers));
  return fmt::format("rounds 1..{}, after round 0's warm-up (its p99 {} us)", rounds - 1,
                     DemoMicros(Summarize(first).p99_us));
}

nlohmann::ordered_json DemoJson(const DemoFlags& f, const DemoConfig& c, std::string_view role, std::string_view path,
                                nlohmann::ordered_json rounds, double transfer_s, std::vector<double> all_layer_us) {
  nlohmann::ordered_json doc = {{"ferry_version", std::string(Version())},
                                {"role", role},
                                {"path", path},
                                {"config",
                                 {{"layers", c.shape.layers},
                                  {"blocks", c.shape.blocks},
                                  {"block_bytes", c.shape.block_bytes},
                                  {"layer_bytes", c.shape.layer_bytes()},
                                  {"cache_bytes", c.shape.total_bytes()},
                                  {"kind", f.kind},
                                  {"alloc", f.alloc},
                                  {"copy_threads", f.threads},
                                  {"rounds", f.rounds},
                                  {"seed", f.seed}}},
                                {"rounds", std::move(rounds)}};
  if (!all_layer_us.empty()) {
    // Per layer: the steady rounds only (SteadyLayers), as the text reports them.
    std::vector<double> steady = SteadyLayers(all_layer_us, c.shape.layers, f.rounds);
    const LatencySummary lat = Summarize(steady);
    const double moved = static_cast<double>(c.shape.total_bytes() * f.rounds);
    doc["total"] = {{"bytes", c.shape.total_bytes() * f.rounds},
                    {"seconds", transfer_s},
                    {"gbps", GigabytesPerSecond(moved, transfer_s)},
                    {"layer_us", {{"median", lat.median_us}, {"p99", lat.p99_us}, {"max", lat.max_us}}},
                    {"layer_us_warmup_rounds_excluded", f.rounds > 1 ? 1 : 0}};
  }
  return doc;
}

}  // namespace ferry::tools
