// `ferry embed-serve`: the embedding-offload service of one node (ferry/embed_server.h). It
// builds the layers' layouts from the model flags, opens one safetensors table per layer
// (--table, repeated) or a synthetic one, listens on --socket and serves until SIGINT or
// SIGTERM. --ready-file is written once the socket listens (for scripts and tests). Every flag
// is checked before the table is built (a synthetic table larger than the memory available is
// refused, naming the flags that shrink it); --socket may name nothing or a stale socket, never
// a file that is not a socket or a socket a live service accepts on.
// --uva auto|always|off: with auto (the default) or always the tables are page-locked at start,
// so that layer steps for CUDA outputs may run the UVA kernel (auto: whichever path is faster
// per token-count bucket, as measured; always: UVA whenever possible). On exit it prints its
// counters and per-bucket phase timings (also available while running, `ferry bench-embed`
// reads them through the protocol's StatsRequest). --metrics-port serves them as Prometheus text
// (GET /metrics on 127.0.0.1: counters and fixed-bucket phase histograms, RenderPrometheus).
#include <fmt/format.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "embed_flags.h"
#include "embed_json.h"
#include "ferry/embed.h"
#include "ferry/embed_server.h"
#include "ferry/embed_service.h"
#include "ferry/embed_stats.h"
#include "json_out.h"
#include "metrics_http.h"
#include "observe.h"

namespace ferry::tools {
namespace {

constexpr std::string_view kCmd = "embed-serve";

struct ServeFlags {
  std::string socket;
  std::string ready_file;
  ModelFlags model;
  std::vector<uint32_t> layers = {0};
  std::string dtype = "bf16";
  std::vector<std::string> tables;
  uint64_t synthetic_rows = 0;
  int threads = 4;
  int64_t chunk_tokens = 32;
  bool streaming_stores = false;
  std::string staging_stores = "streaming";
  double wait_timeout_s = 30;
  std::string uva = "auto";
  uint64_t copy_min_kib = 1024;
  int uva_probes = 3;
  int uva_reprobe_every = 64;
  uint64_t max_connections = 256;
  std::vector<uint32_t> allow_uids;
  int pump_cpus = -1;
  std::string overlap = "on";
  bool pump_host_copies = false;
  int metrics_port = 0;  // 0 off, -1 any free port
  JsonFlag json;  // the counters and phase timings at exit
};

// Every flag's value, checked before anything is built: the server's options, the socket path
// (nothing, or a stale socket, in an existing folder), the ready file's folder.
Result<embed::service::ServerOptions> CheckFlags(const ServeFlags& f) {
  namespace svc = embed::service;
  embed::service::ServerOptions o;
  o.socket_path = f.socket;
  FERRY_ASSIGN_OR_RETURN(o.wait_timeout,
                         DurationFlag("--wait-timeout", f.wait_timeout_s, svc::kMaxWaitTimeout));
  FERRY_RETURN_IF_ERROR(RangeFlag("--threads", f.threads, 1, embed::kMaxGatherThreads));
  FERRY_RETURN_IF_ERROR(RangeFlag("--chunk-tokens", f.chunk_tokens, 1, embed::kMaxChunkTokens));
  FERRY_RETURN_IF_ERROR(RangeFlag("--uva-probes", f.uva_probes, 1, svc::kMaxPolicyCount));
  FERRY_RETURN_IF_ERROR(
      RangeFlag("--uva-reprobe-every", f.uva_reprobe_every, 0, svc::kMaxPolicyCount));
  FERRY_RETURN_IF_ERROR(RangeFlag("--copy-min-kib", static_cast<int64_t>(std::min<uint64_t>(
                                                        f.copy_min_kib, INT64_MAX)),
                                  1, 1 << 30));
  FERRY_RETURN_IF_ERROR(RangeFlag("--max-connections",
                                  static_cast<int64_t>(std::min<uint64_t>(f.max_connections, INT64_MAX)),
                                  1, static_cast<int64_t>(svc::kMaxConnections)));
  if (f.layers.empty()) return Status(Code::kInvalidArgument, "--layers needs a layer");
  for (size_t i = 0; i < f.layers.size(); ++i) {
    FERRY_RETURN_IF_ERROR(RangeFlag("--layers", f.layers[i], 0, svc::kMaxLayerIndex));
    for (size_t j = 0; j < i; ++j)
      if (f.layers[j] == f.layers[i])
        return Status(Code::kInvalidArgument,
                      "--layers lists " + std::to_string(f.layers[i]) + " twice");
  }
  if (!f.tables.empty() && f.tables.size() != f.layers.size())
    return Status(Code::kInvalidArgument, std::to_string(f.tables.size()) + " --table files for " +
                                              std::to_string(f.layers.size()) + " --layers");
  FERRY_ASSIGN_OR_RETURN(o.policy.mode, svc::ParseUvaMode(f.uva));
  o.gather.threads = f.threads;
  o.gather.chunk_tokens = f.chunk_tokens;
  o.gather.streaming_stores = f.streaming_stores;
  o.streaming_staging = f.staging_stores == "streaming";
  o.min_copy_bytes = f.copy_min_kib * 1024;
  o.policy.probes = f.uva_probes;
  o.policy.reprobe_every = f.uva_reprobe_every;
  o.max_connections = f.max_connections;
  o.allowed_uids = f.allow_uids;
  o.pump_cpus = f.pump_cpus;
  o.overlap_layers = f.overlap == "on";
  o.pump_host_copies = f.pump_host_copies;
  FERRY_RETURN_IF_ERROR(svc::ValidateServerOptions(o));
  FERRY_RETURN_IF_ERROR(svc::CheckListenPath(f.socket).WithContext("--socket"));
  FERRY_RETURN_IF_ERROR(CheckJsonTarget(f.json));
  if (!f.ready_file.empty()) {
    const size_t slash = f.ready_file.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : f.ready_file.substr(0, slash);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status(Code::kInvalidArgument,
                    "--ready-file " + f.ready_file + ": folder " + dir + " does not exist");
    if (::stat(f.ready_file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return Status(Code::kInvalidArgument,
                    "--ready-file " + f.ready_file + " is not a regular file");
  }
  return o;
}

// Writes the socket path to the ready file: a regular file (O_NONBLOCK: a FIFO there would
// block the open until a reader came; it is refused instead).
Status WriteReadyFile(const std::string& path, const std::string& socket) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENXIO)
    return Status(Code::kInvalidArgument, "--ready-file " + path + " is not a regular file");
  if (fd < 0) return Status(Code::kInvalidArgument, "cannot write --ready-file " + path);
  struct stat st {};
  Status s;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    s = Status(Code::kInvalidArgument, "--ready-file " + path + " is not a regular file");
  else if (::write(fd, socket.data(), socket.size()) != static_cast<ssize_t>(socket.size()))
    s = Status(Code::kInternal, "cannot write --ready-file " + path);
  ::close(fd);
  return s;
}

Status Serve(const ServeFlags& f) {
  embed::Config c = ToConfig(f.model);
  FERRY_ASSIGN_OR_RETURN(embed::Dtype dtype, embed::ParseDtype(f.dtype));
  FERRY_ASSIGN_OR_RETURN(embed::service::ServerOptions o, CheckFlags(f));
  const embed::service::UvaMode uva = o.policy.mode;
  std::vector<embed::service::ServedLayer> layers;
  Status pinned;
  std::FILE* out = TextStream(f.json);
  {
    // A large table takes a while to fill (or read) and pin: say so rather than stay silent.
    fmt::print(stderr, "ferry embed-serve: building {} table{} for {} layer(s)\n",
               f.tables.empty() ? "the synthetic" : "the", f.tables.empty() ? "" : "s", f.layers.size());
    FERRY_ASSIGN_OR_RETURN(embed::Workers pool, embed::MakeWorkers(f.threads, "embed-fill"));
    Result<std::vector<embed::service::ServedLayer>> made = embed::service::MakeServedLayers(
        c, f.layers, dtype, f.tables, f.synthetic_rows, pool.get(),
        uva == embed::service::UvaMode::kOff ? nullptr : &pinned);
    if (!made.ok() && made.status().code() == Code::kResourceExhausted && f.tables.empty())
      return Status(Code::kResourceExhausted,
                    std::string(made.status().message()) +
                        "; shrink it with --base-vocab, --synthetic-rows, --embed-dim, --heads "
                        "or --dtype, or serve tables from files (--table)");
    FERRY_ASSIGN_OR_RETURN(layers, std::move(made));
  }
  if (!pinned.ok()) {
    if (uva == embed::service::UvaMode::kAlways)
      return pinned.WithContext("--uva always needs a pinned table");
    fmt::print(out, "ferry embed-serve: no UVA path (the table is not pinned: {})\n", pinned.ToString());
  }
  // Signals are taken synchronously below; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  FERRY_ASSIGN_OR_RETURN(auto server, embed::service::Server::Create(o, std::move(layers)));
  fmt::print(out, "ferry embed-serve: listening on {} ({} layers, {} table)\n", f.socket,
             f.layers.size(), f.tables.empty() ? "synthetic" : "file");
  // Started after the signals are blocked: its thread inherits the mask, so SIGTERM still
  // reaches sigwait below.
  std::unique_ptr<MetricsHttpServer> metrics;
  if (f.metrics_port != 0) {
    embed::service::Server* s = server.get();
    FERRY_ASSIGN_OR_RETURN(metrics,
                           MetricsHttpServer::Start("127.0.0.1:" + std::to_string(std::max(f.metrics_port, 0)),
                                                    [s] { return embed::service::RenderPrometheus(s->stats()); }));
    fmt::print(out, "ferry embed-serve: metrics on http://{}/metrics\n", metrics->address());
  }
  std::fflush(out);
  if (!f.ready_file.empty()) FERRY_RETURN_IF_ERROR(WriteReadyFile(f.ready_file, f.socket));
  int sig = 0;
  sigwait(&set, &sig);
  metrics.reset();  // no scrape of a stopping server
  server->Stop();
  auto st = server->stats();
  fmt::print(out, "ferry embed-serve: stopped by signal {}: {} registrations, {} steps, {} failed\n",
             sig, st.registrations, st.steps_ok + st.steps_failed, st.steps_failed);
  if (!st.buckets.empty())
    fmt::print(out, "layer steps by token bucket (median (mean) us per phase, uva {}):\n{}",
               embed::service::UvaModeName(uva), embed::service::FormatStats(st));
  std::fflush(out);
  nlohmann::ordered_json doc = {{"socket", f.socket},
                                {"layers", f.layers},
                                {"table", f.tables.empty() ? "synthetic" : "file"},
                                {"uva", embed::service::UvaModeName(uva)},
                                {"stopped_by_signal", sig},
                                {"stats", EmbedStatsJson(st)}};
  return WriteJson(f.json, doc);
}

}  // namespace

void AddEmbedServeCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "embed-serve", "Serve offloaded n-gram embedding rows to the GPU workers of this node");
  auto f = std::make_shared<ServeFlags>();
  cmd->add_option("--socket", f->socket, "Unix socket path to listen on")->required();
  cmd->add_option("--ready-file", f->ready_file, "Written once the socket listens");
  AddModelFlags(cmd, &f->model);
  cmd->add_option("--layers", f->layers, "Layer indices served")->capture_default_str();
  cmd->add_option("--dtype", f->dtype, "Row dtype: bf16, f16, f32, f8_e4m3, nvfp4")
      ->capture_default_str();
  cmd->add_option("--table", f->tables, "Safetensors table, one per layer (default: synthetic)");
  cmd->add_option("--synthetic-rows", f->synthetic_rows,
                  "Rows of the synthetic table (0: the largest layer's)")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "Gather threads")->capture_default_str();
  cmd->add_option("--chunk-tokens", f->chunk_tokens, "Tokens per gather and copy chunk")
      ->capture_default_str();
  cmd->add_flag("--streaming-stores", f->streaming_stores,
               "Write rows gathered into host outputs with non-temporal stores");
  cmd->add_option("--staging-stores", f->staging_stores,
                  "CUDA outputs: stores of rows gathered into the pinned staging (streaming: "
                  "non-temporal, no read for ownership; normal)")
      ->check(CLI::IsMember({"streaming", "normal"}))
      ->capture_default_str();
  cmd->add_option("--wait-timeout", f->wait_timeout_s,
                  "Seconds a step waits for released outputs or absent ranks")
      ->capture_default_str();
  cmd->add_option("--uva", f->uva,
                  "Layer steps for CUDA outputs: auto (the faster path per token bucket), always "
                  "(the UVA kernel), off (the CPU gather); auto and always pin the tables")
      ->check(CLI::IsMember({"auto", "always", "off"}))
      ->capture_default_str();
  cmd->add_option("--copy-min-kib", f->copy_min_kib,
                  "CUDA outputs: least KiB of gathered rows per copy (but the last)")
      ->capture_default_str();
  cmd->add_option("--uva-probes", f->uva_probes,
                  "auto: steps of each path per bucket before choosing")
      ->capture_default_str();
  cmd->add_option("--uva-reprobe-every", f->uva_reprobe_every,
                  "auto: every n-th choice runs the other path once (0: never)")
      ->capture_default_str();
  cmd->add_option("--max-connections", f->max_connections,
                  "Connections served at once (GPU worker ranks and monitors); more are refused")
      ->capture_default_str();
  cmd->add_option("--allow-uid", f->allow_uids,
                  "A user id, besides this process's own, whose processes may connect (repeatable; "
                  "default: the same user only)");
  cmd->add_option("--pump-cpus", f->pump_cpus,
                  "CPUs kept for the copy pumps, apart from the gather threads (-1: one when "
                  "there are more CPUs than --threads; 0: no pinning)")
      ->capture_default_str();
  cmd->add_option("--overlap", f->overlap,
                  "Copy-pump path: gather the next layer while this one's copies finish (on), "
                  "or one layer at a time (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--pump-host-copies", f->pump_host_copies,
                "Host outputs of other tensor-parallel ranks through the copy pump too (the "
                "CUDA path's pipeline, on a machine without a GPU)");
  AddMetricsPortOption(cmd, &f->metrics_port);
  AddJsonFlag(cmd, &f->json, "The counters and per-bucket phase timings at exit");
  cmd->callback([f, exit_code] {
    Status s = Serve(*f);
    *exit_code = s.ok() ? 0 : Fail(kCmd, s);
  });
}

}  // namespace ferry::tools
