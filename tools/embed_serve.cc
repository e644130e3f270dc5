// `ferry embed-serve`: the embedding-offload service of one node (src/embed/service/). It
// builds the layers' layouts from the model flags, opens one safetensors table per layer
// (--table, repeated) or a synthetic one, listens on --socket and serves until SIGINT or
// SIGTERM. --ready-file is written once the socket listens (for scripts and tests).
// --uva auto|always|off: with auto (the default) or always the tables are page-locked at start,
// so that layer steps for CUDA outputs may run the UVA kernel (auto: whichever path is faster
// per token-count bucket, as measured; always: UVA whenever possible). On exit it prints its
// counters and per-bucket phase timings (also available while running, `ferry bench-embed`
// reads them through the protocol's StatsRequest).
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "commands.h"
#include "embed_flags.h"
#include "embed/config.h"
#include "embed/service/served_layers.h"
#include "embed/service/server.h"
#include "embed/service/step_policy.h"
#include "embed/service/step_stats.h"

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
};

Status Serve(const ServeFlags& f) {
  embed::Config c = ToConfig(f.model);
  FERRY_ASSIGN_OR_RETURN(embed::Dtype dtype, embed::ParseDtype(f.dtype));
  if (f.wait_timeout_s <= 0)
    return Status(Code::kInvalidArgument, "--wait-timeout must be positive");
  FERRY_ASSIGN_OR_RETURN(embed::service::UvaMode uva, embed::service::ParseUvaMode(f.uva));
  std::vector<embed::service::ServedLayer> layers;
  Status pinned;
  {
    ThreadPool pool(std::max(1, f.threads), "embed-fill");
    FERRY_ASSIGN_OR_RETURN(layers, embed::service::MakeServedLayers(
                                       c, f.layers, dtype, f.tables, f.synthetic_rows, &pool,
                                       uva == embed::service::UvaMode::kOff ? nullptr : &pinned));
  }
  if (!pinned.ok()) {
    if (uva == embed::service::UvaMode::kAlways)
      return pinned.WithContext("--uva always needs a pinned table");
    fmt::print("ferry embed-serve: no UVA path (the table is not pinned: {})\n", pinned.ToString());
  }
  embed::service::ServerOptions o;
  o.socket_path = f.socket;
  o.gather.threads = f.threads;
  o.gather.chunk_tokens = f.chunk_tokens;
  o.gather.streaming_stores = f.streaming_stores;
  o.streaming_staging = f.staging_stores == "streaming";
  o.min_copy_bytes = std::max<uint64_t>(1, f.copy_min_kib) * 1024;
  o.policy.mode = uva;
  o.policy.probes = f.uva_probes;
  o.policy.reprobe_every = f.uva_reprobe_every;
  o.wait_timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(f.wait_timeout_s));
  // Signals are taken synchronously below; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  FERRY_ASSIGN_OR_RETURN(auto server, embed::service::Server::Create(o, std::move(layers)));
  fmt::print("ferry embed-serve: listening on {} ({} layers, {} table)\n", f.socket,
             f.layers.size(), f.tables.empty() ? "synthetic" : "file");
  std::fflush(stdout);
  if (!f.ready_file.empty()) {
    std::FILE* rf = std::fopen(f.ready_file.c_str(), "w");
    if (rf == nullptr) return Status(Code::kInvalidArgument, "cannot write " + f.ready_file);
    std::fputs(f.socket.c_str(), rf);
    std::fclose(rf);
  }
  int sig = 0;
  sigwait(&set, &sig);
  server->Stop();
  auto st = server->stats();
  fmt::print("ferry embed-serve: stopped by signal {}: {} registrations, {} steps, {} failed\n",
             sig, st.registrations, st.steps_ok + st.steps_failed, st.steps_failed);
  if (!st.buckets.empty())
    fmt::print("layer steps by token bucket (median (mean) us per phase, uva {}):\n{}",
               embed::service::UvaModeName(uva), embed::service::FormatStats(st));
  std::fflush(stdout);
  return Status::Ok();
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
  cmd->callback([f, exit_code] {
    Status s = Serve(*f);
    *exit_code = s.ok() ? 0 : Fail(kCmd, s);
  });
}

}  // namespace ferry::tools
