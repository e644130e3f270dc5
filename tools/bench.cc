// `ferry bench`: transfer throughput and latency over a grid of piece sizes and batch sizes.
// The grid and the output live here; the loop is in bench_loop.cc and the session comes from a
// Link (link.h), so a two-process link can be added without touching either.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "bench_loop.h"
#include "buffers.h"
#include "commands.h"
#include "ferry/system.h"
#include "json_out.h"
#include "link.h"
#include "observe.h"
#include "report.h"
#include "transport_flag.h"
#include "units.h"

namespace ferry::tools {
namespace {

struct BenchFlags {
  std::string sizes = "4K..64M";
  std::string batches = "1,16,256";
  std::string max_bytes = "256M";
  std::string op = "write";
  std::string kind = "host";
  bool no_baseline = false;
  std::string alloc = "heap";  // host buffers: heap or shared (reachable by `shm`)
  int device = 0;
  uint64_t iters = 5;
  double min_time_s = 0.2;
  int threads = 0;
  std::string parallel_bytes = "1M";
  double deadline_s = 30;
  JsonFlag json;
  // Two processes: seconds --peer waits for the listener (dialling and its descriptors), and
  // --listen for its peer; unset: 30 s and an hour.
  double timeout_s = 30;
  bool timeout_given = false;
  std::string listen;     // two processes: serve a buffer here ("host:port")
  std::string peer;       // two processes: measure against the buffer served there
  std::vector<std::string> transports;  // restrict the engines' transports (e.g. ucx)
  std::string ucx_progress = "event";
  std::string ucx_rma = "auto";
  int ucx_lanes = 1;
  int ucx_workers = 1;
  int ucx_post_batch = UcxOptions{}.post_batch;
  int64_t pings = 0;  // notification round trips to time (two processes)
  int ping_cpu = -1;  // CPU of the thread that pings or answers (-1: any)
  int metrics_port = 0;  // --listen: serve GET /metrics here (0 off, -1 any free port)
  uint64_t run = 1;      // pieces lie in runs of this many adjacent slots on both sides
  bool no_merge = false;  // EngineOptions::merge_adjacent_ops off
  std::set<std::string> given;  // long names of the flags on the command line ("threads")

  bool Given(const std::string& name) const { return given.count(name) > 0; }
};

constexpr int64_t kMaxPings = 10'000'000;

struct Grid {
  std::vector<PointSpec> points;
  std::vector<std::pair<uint64_t, uint64_t>> skipped;  // (piece, batch) over --max-bytes
  uint64_t largest_batch_bytes = 0;
};

Result<Grid> MakeGrid(const BenchFlags& f) {
  FERRY_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, ParseBytesList(f.sizes));
  FERRY_ASSIGN_OR_RETURN(std::vector<uint64_t> batches, ParseCountList(f.batches));
  FERRY_ASSIGN_OR_RETURN(uint64_t max_bytes, ParseBytes(f.max_bytes));
  if (f.iters == 0) return Status(Code::kInvalidArgument, "--iters must be at least 1");
  // Checked before the sweep: a bad --pings would otherwise fail only after it.
  if (f.pings < 0 || f.pings > kMaxPings)
    return Status(Code::kInvalidArgument, fmt::format("--pings must be in 0..{}, not {}", kMaxPings, f.pings));
  if (f.pings > 0 && f.peer.empty())
    return Status(Code::kInvalidArgument, "--pings times notifications to another process: it needs --peer");
  PointSpec base;
  FERRY_ASSIGN_OR_RETURN(base.min_time, ParseSeconds(f.min_time_s, "--min-time", /*allow_zero=*/true));
  FERRY_ASSIGN_OR_RETURN(base.deadline, ParseSeconds(f.deadline_s, "--deadline"));
  base.op = f.op == "read" ? Op::kRead : Op::kWrite;
  base.min_iters = f.iters;
  Grid grid;
  for (uint64_t size : sizes) {
    for (uint64_t batch : batches) {
      uint64_t total = 0;
      if (__builtin_mul_overflow(size, batch, &total) || total > max_bytes) {
        grid.skipped.emplace_back(size, batch);
        continue;
      }
      PointSpec p = base;
      p.piece_bytes = size;
      p.batch = batch;
      grid.points.push_back(p);
      grid.largest_batch_bytes = std::max(grid.largest_batch_bytes, total);
    }
  }
  if (grid.points.empty())
    return Status(Code::kInvalidArgument,
                  fmt::format("every point exceeds --max-bytes {}", FormatBytes(max_bytes)));
  return grid;
}

struct BaselinePoint {
  uint64_t piece_bytes = 0;
  uint64_t batch = 0;
  double gbps = 0;
};

std::string Micros(double us) {
  if (us < 10) return fmt::format("{:.2f}", us);
  if (us < 1000) return fmt::format("{:.1f}", us);
  return fmt::format("{:.0f}", us);
}

void PrintTable(std::FILE* out, const std::vector<PointResult>& results) {
  Table table;
  for (const char* title :
       {"piece", "batch", "bytes/batch", "iters", "GB/s", "median us", "p99 us"})
    table.AddColumn(title);
  for (const PointResult& r : results) {
    table.AddRow({FormatBytes(r.spec.piece_bytes), std::to_string(r.spec.batch),
                  FormatBytes(r.spec.piece_bytes * r.spec.batch), std::to_string(r.iters),
                  fmt::format("{:.2f}", r.gbps), Micros(r.latency.median_us),
                  Micros(r.latency.p99_us)});
  }
  table.Print(out);
}

nlohmann::ordered_json JsonReport(const BenchFlags& f, const Link& link, const Grid& grid,
                                  const std::vector<PointResult>& results, const LatencySummary* pings) {
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const PointResult& r : results) {
    points.push_back({{"op", f.op},
                      {"kind", f.kind},
                      {"piece_bytes", r.spec.piece_bytes},
                      {"batch", r.spec.batch},
                      {"batch_bytes", r.spec.piece_bytes * r.spec.batch},
                      {"iters", r.iters},
                      {"bytes", r.bytes},
                      {"seconds", r.seconds},
                      {"gbps", r.gbps},
                      {"latency_us",
                       {{"min", r.latency.min_us},
                        {"median", r.latency.median_us},
                        {"p99", r.latency.p99_us},
                        {"max", r.latency.max_us},
                        {"mean", r.latency.mean_us}}}});
  }
  nlohmann::ordered_json skipped = nlohmann::ordered_json::array();
  for (auto [piece, batch] : grid.skipped)
    skipped.push_back({{"piece_bytes", piece}, {"batch", batch}});
  nlohmann::ordered_json doc = {{"ferry_version", std::string(Version())},
                                {"link", link.Describe()},
                                {"config",
                                 {{"sizes", f.sizes},
                                  {"batches", f.batches},
                                  {"max_bytes", f.max_bytes},
                                  {"iters", f.iters},
                                  {"min_time_s", f.min_time_s},
                                  {"copy_threads", f.threads},
                                  {"parallel_copy_bytes", f.parallel_bytes},
                                  {"deadline_s", f.deadline_s},
                                  {"run", f.run},
                                  {"merge_adjacent_ops", !f.no_merge}}},
                                {"points", points},
                                {"skipped", skipped}};
  if (pings != nullptr)
    doc["notification_one_way_us"] = {{"round_trips", f.pings},
                                      {"min", pings->min_us},
                                      {"median", pings->median_us},
                                      {"p99", pings->p99_us},
                                      {"max", pings->max_us},
                                      {"mean", pings->mean_us}};
  return doc;
}

std::chrono::milliseconds TimeoutOr(const BenchFlags& f, std::chrono::milliseconds unset) {
  if (!f.timeout_given) return unset;
  auto t = ParseSeconds(f.timeout_s, "--timeout");  // checked in Run
  return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(*t));
}

// The engines' options: the flags' values, then every FERRY_* variable set
// (docs/configuration.md), then the flags given on the command line again, so that a flag
// overrides the environment and the environment overrides a flag's default.
Result<EngineOptions> MakeEngineOptions(const BenchFlags& f) {
  auto apply = [&f](EngineOptions& e, bool only_given) -> Status {
    auto use = [&](const char* name) { return !only_given || f.Given(name); };
    if (use("threads")) e.copy_threads = f.threads;
    if (use("parallel-bytes")) {
      FERRY_ASSIGN_OR_RETURN(e.parallel_copy_bytes, ParseBytes(f.parallel_bytes));
    }
    if (use("transport")) e.transports = f.transports;
    if (use("deadline")) {
      FERRY_ASSIGN_OR_RETURN(e.default_deadline, ParseSeconds(f.deadline_s, "--deadline"));
    }
    if (use("ucx-progress"))
      e.ucx.progress = f.ucx_progress == "poll"     ? UcxOptions::Progress::kPolling
                       : f.ucx_progress == "shared" ? UcxOptions::Progress::kShared
                                                    : UcxOptions::Progress::kEvent;
    if (use("ucx-rma"))
      e.ucx.rma = f.ucx_rma == "always"  ? UcxOptions::Rma::kAlways
                  : f.ucx_rma == "never" ? UcxOptions::Rma::kNever
                                         : UcxOptions::Rma::kAuto;
    if (use("ucx-lanes")) e.ucx.lanes = f.ucx_lanes;
    if (use("ucx-workers")) e.ucx.workers = f.ucx_workers;
    if (use("ucx-post-batch")) e.ucx.post_batch = f.ucx_post_batch;
    if (use("no-merge")) e.merge_adjacent_ops = !f.no_merge;
    if (use("metrics-port")) e.metrics_port = f.metrics_port;
    return Status::Ok();
  };
  EngineOptions defaults;
  FERRY_RETURN_IF_ERROR(apply(defaults, false));
  FERRY_ASSIGN_OR_RETURN(EngineOptions e, EngineOptions::FromEnv(defaults));
  FERRY_RETURN_IF_ERROR(apply(e, true));
  return e;
}

// Where the session comes from: two engines of this process, or (--peer) a `ferry bench
// --listen` process reached through a side channel. The grid, the loop and the output are
// the same for both.
Result<std::unique_ptr<Link>> MakeLink(const BenchFlags& f, uint64_t bytes) {
  FERRY_ASSIGN_OR_RETURN(MemoryKind kind, ParseMemoryKind(f.kind));
  if (kind == MemoryKind::kCuda) {
    std::string reason;
    if (!CudaAvailable(&reason)) return Status(Code::kUnsupported, "--kind cuda: " + reason);
  }
  FERRY_ASSIGN_OR_RETURN(EngineOptions engine, MakeEngineOptions(f));
  FERRY_ASSIGN_OR_RETURN(HostAlloc alloc, ParseHostAlloc(f.alloc));
  if (!f.peer.empty()) {
    const auto timeout = TimeoutOr(f, RemoteLinkOptions{}.connect_timeout);
    // Dialling a listener that is not there is silent until the timeout: say what it waits for.
    fmt::print(stderr, "ferry bench: connecting to the listener at {}, for up to {:g} s (--timeout)\n", f.peer,
               timeout.count() / 1e3);
    std::fflush(stderr);
    RemoteLinkOptions r;
    r.alloc = alloc;
    r.peer = f.peer;
    r.kind = kind;
    r.device = f.device;
    r.bytes = bytes;
    r.engine = engine;
    r.ping_cpu = f.ping_cpu;
    r.connect_timeout = timeout;
    auto link = MakeRemoteLink(r);
    if (!link.ok() && link.status().code() == Code::kUnavailable)
      return link.status().WithContext(
          fmt::format("no `ferry bench --listen` answered at {} within {:g} s (--timeout)", f.peer, timeout.count() / 1e3));
    return link;
  }
  FERRY_ASSIGN_OR_RETURN(uint64_t parallel_bytes, ParseBytes(f.parallel_bytes));
  InProcessLinkOptions o;
  o.kind = kind;
  o.alloc = alloc;
  o.device = f.device;
  o.bytes = bytes;
  o.engine.copy_threads = f.threads;
  o.engine.parallel_copy_bytes = parallel_bytes;
  o.engine.merge_adjacent_ops = engine.merge_adjacent_ops;
  o.engine.transports = f.transports;  // both engines: the path is one they share
  return MakeInProcessLink(o);
}

// --listen: serve a buffer of --max-bytes to one --peer run, then exit.
int Serve(const BenchFlags& f) {
  auto kind = ParseMemoryKind(f.kind);
  if (!kind.ok()) return Fail("bench", kind.status());
  auto bytes = ParseBytes(f.max_bytes);
  if (!bytes.ok()) return Fail("bench", bytes.status());
  auto engine = MakeEngineOptions(f);
  if (!engine.ok()) return Fail("bench", engine.status());
  auto alloc = ParseHostAlloc(f.alloc);
  if (!alloc.ok()) return Fail("bench", alloc.status());
  ServeOptions o;
  o.alloc = *alloc;
  o.listen = f.listen;
  o.kind = *kind;
  o.device = f.device;
  o.bytes = *bytes;
  o.engine = *engine;
  o.ping_cpu = f.ping_cpu;
  o.wait = TimeoutOr(f, std::chrono::duration_cast<std::chrono::milliseconds>(o.wait));
  Status s = ServeBench(o, [&](const std::string& address) {
    fmt::print("ferry bench: serving {} of {} memory; side channel on {}\n", FormatBytes(*bytes), f.kind,
               address);
    fmt::print(stderr, "ferry bench: waiting up to {:g} s for a `ferry bench --peer` (--timeout)\n",
               o.wait.count() / 1e3);
    std::fflush(stdout);
  });
  if (!s.ok()) return Fail("bench", s);
  fmt::print("ferry bench: the peer is done\n");
  return 0;
}

// Flags that every mode shares, checked before anything starts.
Status CheckCommon(const BenchFlags& f) {
  if (!f.listen.empty() && !f.peer.empty())
    return Status(Code::kInvalidArgument, "--listen and --peer exclude each other");
  if (f.timeout_given) FERRY_RETURN_IF_ERROR(ParseSeconds(f.timeout_s, "--timeout").status());
  if (f.timeout_given && f.listen.empty() && f.peer.empty())
    return Status(Code::kInvalidArgument, "--timeout is how long one process waits for the other: it needs --listen or --peer");
  FERRY_RETURN_IF_ERROR(CheckTransportFlag(f.transports));
  if (f.kind == "host") FERRY_RETURN_IF_ERROR(CheckTransportAlloc(f.transports, f.alloc == "shared"));
  if (!f.listen.empty() && f.json.given())
    return Status(Code::kInvalidArgument, "--json: the --peer side measures and reports; --listen has no figures");
  return CheckJsonTarget(f.json);
}

int Run(const BenchFlags& f) {
  if (Status s = CheckCommon(f); !s.ok()) return Fail("bench", s);
  if (!f.listen.empty()) return Serve(f);
  auto grid = MakeGrid(f);
  if (!grid.ok()) return Fail("bench", grid.status());
  auto link = MakeLink(f, grid->largest_batch_bytes);
  if (!link.ok()) return Fail("bench", link.status());
  std::FILE* out = TextStream(f.json);
  fmt::print(out, "ferry bench: {}, {}\n", f.op, (*link)->Describe());
  std::fflush(out);

  std::vector<PointResult> results;
  std::vector<BaselinePoint> baseline;
  Progress progress("bench", grid->points.size());
  for (const PointSpec& spec : grid->points) {
    progress.Update(results.size(),
                    fmt::format("{} x {}", FormatBytes(spec.piece_bytes), spec.batch));
    std::vector<TransferOp> ops = PlanScatteredOps(spec.piece_bytes, spec.batch, f.run);
    auto r = MeasurePoint((*link)->session(), spec, ops);
    if (!r.ok()) {
      progress.Done();
      return Fail("bench", r.status().WithContext(
                               fmt::format("{} x {}", FormatBytes(spec.piece_bytes), spec.batch)));
    }
    results.push_back(std::move(r).value());
    // The same run's baseline, beside each host-memory point in the JSON (bench/plot.py draws it).
    if (f.kind == "host" && !f.no_baseline)
      baseline.push_back({spec.piece_bytes, spec.batch, MemcpyBaselineGbps(ops, spec.min_time / 4)});
  }
  progress.Done();
  PrintTable(out, results);
  std::optional<LatencySummary> pings;
  if (f.pings > 0) {
    auto lat = (*link)->NotificationLatencyUs(static_cast<int>(f.pings));
    if (!lat.ok()) return Fail("bench", lat.status().WithContext("notification latency"));
    pings = Summarize(*lat);
    fmt::print(out, "notification one-way latency ({} round trips / 2): median {} us, p99 {} us\n", f.pings,
               Micros(pings->median_us), Micros(pings->p99_us));
  }
  if (!grid->skipped.empty()) {
    std::vector<std::string> names;
    for (auto [piece, batch] : grid->skipped)
      names.push_back(fmt::format("{} x {}", FormatBytes(piece), batch));
    fmt::print(out, "skipped (over --max-bytes {}): {}\n", f.max_bytes, fmt::join(names, ", "));
  }
  std::fflush(out);
  nlohmann::ordered_json doc = JsonReport(f, **link, *grid, results, pings ? &*pings : nullptr);
  doc["baseline_what"] = baseline.empty() ? "none (--kind cuda or --no-baseline)"
                                          : "memcpy of the same pieces by one thread, host buffers, this run";
  doc["baseline"] = nlohmann::ordered_json::array();
  for (const BaselinePoint& b : baseline)
    doc["baseline"].push_back({{"piece_bytes", b.piece_bytes}, {"batch", b.batch}, {"gbps", b.gbps}});
  Status s = WriteJson(f.json, doc);
  if (!s.ok()) return Fail("bench", s);
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "bench", "Transfer throughput and latency over piece sizes x batch sizes (in one process, "
      "or two with --listen/--peer)");
  auto f = std::make_shared<BenchFlags>();
  cmd->add_option("--sizes", f->sizes,
                  "Piece sizes: a list (4K,1M) or ranges (4K..64M = powers of 4, 4K..64M:2)")
      ->capture_default_str();
  cmd->add_option("--batches", f->batches, "Pieces per batch, a list")->capture_default_str();
  cmd->add_option("--max-bytes", f->max_bytes, "Skip points whose batch moves more than this")
      ->capture_default_str();
  cmd->add_option("--op", f->op, "write or read")
      ->check(CLI::IsMember({"write", "read"}))
      ->capture_default_str();
  cmd->add_option("--kind", f->kind, "Memory of both buffers: host or cuda")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--alloc", f->alloc,
                  "Host buffers from the heap, or shared (peers of this host map them: `shm`)")
      ->check(CLI::IsMember({"heap", "shared"}))
      ->capture_default_str();
  cmd->add_option("--device", f->device, "CUDA device for --kind cuda")->capture_default_str();
  cmd->add_option("--iters", f->iters, "Timed batches per point, at least")->capture_default_str();
  cmd->add_option("--min-time", f->min_time_s, "Seconds per point, at least")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "Copy threads (0 = one per core, at most 8)")
      ->capture_default_str();
  cmd->add_option("--parallel-bytes", f->parallel_bytes,
                  "Batches of at least this many bytes are split over the copy threads")
      ->capture_default_str();
  cmd->add_option("--deadline", f->deadline_s, "Seconds each batch may take before it fails")
      ->capture_default_str();
  cmd->add_option("--run", f->run,
                  "Pieces lie in runs of this many adjacent slots, locally and remotely (runs "
                  "shuffled remotely); 1 = every piece on its own")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  cmd->add_flag("--no-merge", f->no_merge, "Keep adjacent ops apart (EngineOptions::merge_adjacent_ops off)");
  cmd->add_flag("--no-baseline", f->no_baseline,
                "Skip the same run's baseline (one thread's memcpy of each point's pieces, host memory)");
  AddJsonFlag(cmd, &f->json, "Every point (and --pings' latency)");
  cmd->add_option("--listen", f->listen,
                  "Two processes: serve a buffer of --max-bytes for one --peer run; side channel "
                  "on HOST:PORT (port 0 = any; the bound address is printed)");
  cmd->add_option("--peer", f->peer,
                  "Two processes: measure against the buffer a --listen process serves at HOST:PORT");
  cmd->add_option("--transport", f->transports, "Transports the engines may use (default: all)");
  cmd->add_option("--ucx-progress", f->ucx_progress, "ucx progress thread: event, poll or shared (steps back while the application polls)")
      ->check(CLI::IsMember({"event", "poll", "shared"}))
      ->capture_default_str();
  cmd->add_option("--ucx-rma", f->ucx_rma, "ucx one-sided RMA: auto, always or never (active messages)")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  cmd->add_option("--ucx-lanes", f->ucx_lanes, "ucx endpoints per peer")->capture_default_str();
  cmd->add_option("--ucx-post-batch", f->ucx_post_batch, "ucx ops posted before the worker makes progress")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--ucx-workers", f->ucx_workers, "ucx workers (progress threads); a peer's lanes are dealt over them")
      ->capture_default_str();
  cmd->add_option("--pings", f->pings,
                  "Two processes (--peer): also time this many notification round trips (one-way = half)");
  CLI::Option* timeout =
      cmd->add_option("--timeout", f->timeout_s,
                      "Two processes: seconds --peer waits for the listener (default 30), or --listen for its "
                      "peer (default 3600)");
  AddMetricsPortOption(cmd, &f->metrics_port);
  cmd->add_option("--ping-cpu", f->ping_cpu,
                  "Two processes: the CPU of the thread that pings (--peer) or answers (--listen); -1 = any")
      ->capture_default_str();
  cmd->callback([f, cmd, timeout, exit_code] {
    f->timeout_given = timeout->count() > 0;
    for (const CLI::Option* o : cmd->get_options())
      if (o->count() > 0)
        for (const std::string& name : o->get_lnames()) f->given.insert(name);
    *exit_code = Run(*f);
  });
}

}  // namespace ferry::tools
