// `ferry bench-embed`: the embedding-offload service's step time, from the request sent to
// DONE visible for every layer, measured through a real `ferry embed-serve` process (this
// binary, spawned) and the client library, for the model's head layout. Side by side, in the
// same run: the same step gathered in this process by the Gatherer alone (no protocol, no
// copies: what the service adds is the difference), and a naive single-threaded baseline
// (ComputeRowIds, then one memcpy per row, no prefetch, then one copy to the output), and the
// copy of the step's bytes alone: one memcpy per layer in host mode; --kind cuda puts the
// outputs in GPU memory (CUDA mode) and the copy baseline is then a pinned host-to-GPU copy of
// each layer's bytes on one stream. "x copy" is the service step over that copy. --layers
// lists layer counts (1,4: one-layer and four-layer steps, from one service serving the most);
// --overlap on,off runs the service with and without the layer overlap side by side; --uva lists
// the service's UVA modes to run side by side (one service process each, the same steps): off (CPU
// gather), always (UVA kernel), auto (per bucket, the faster). After each shape it prints the
// service's own phase timings for it (StatsRequest: queue, inputs, released wait, drain, gather,
// copy tail, finish, DONE completion) and how many layer steps each path ran.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "embed_flags.h"
#include "embed_json.h"
#include "ferry/embed.h"
#include "ferry/embed_server.h"
#include "ferry/embed_service.h"
#include "ferry/embed_stats.h"
#include "ferry/gpu.h"
#include "ferry/engine.h"
#include "json_out.h"
#include "report.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;
namespace svc = embed::service;
constexpr std::string_view kCmd = "bench-embed";

struct BenchFlags {
  ModelFlags model;
  uint64_t synthetic_rows = 0;
  std::vector<int> layers = {1};
  std::vector<std::string> overlap = {"on"};
  int pump_cpus = -1;
  bool pump_host_copies = false;
  int tp = 1;
  int threads = 2;
  int64_t chunk_tokens = 64;
  bool streaming_stores = false;
  std::string staging_stores = "streaming";
  int iters = 20;
  std::string kind = "host";
  std::vector<std::string> steps = {"8192x8", "256x256"};
  std::vector<std::string> uva;  // empty: off for host, off always auto for cuda
  uint64_t copy_min_kib = 1024;
  JsonFlag json;
};

struct StepShape {
  uint32_t tokens = 0, reqs = 0;
};

Result<StepShape> ParseStep(const std::string& s) {
  StepShape out;
  unsigned t = 0, r = 0;
  if (std::sscanf(s.c_str(), "%ux%u", &t, &r) != 2 || t == 0 || r == 0 || r > t ||
      t > svc::kMaxTokens || r > svc::kMaxRequests)
    return Status(Code::kInvalidArgument, "--step wants TOKENSxREQUESTS, e.g. 8192x8: " + s);
  out.tokens = t;
  out.reqs = r;
  return out;
}

struct Inputs {
  std::vector<int32_t> tokens, qsl, ctx;
};

Inputs MakeInputs(const StepShape& s, const embed::Config& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in;
  for (uint32_t i = 0; i < s.tokens; ++i)
    in.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
  for (uint32_t r = 0; r <= s.reqs; ++r)
    in.qsl.push_back(r == s.reqs ? s.tokens : r * (s.tokens / s.reqs));
  for (uint32_t i = 0; i < s.reqs * static_cast<uint32_t>(c.ngram_size - 1); ++i)
    in.ctx.push_back(static_cast<int32_t>(rng() % c.vocab_size));
  return in;
}

struct Stats {
  double median_ms = 0, mean_ms = 0, min_ms = 0;
};
Stats Summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Stats s;
  s.median_ms = ms[ms.size() / 2];
  s.min_ms = ms.front();
  for (double x : ms) s.mean_ms += x / ms.size();
  return s;
}
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int MaxLayers(const BenchFlags& f) { return *std::max_element(f.layers.begin(), f.layers.end()); }

// Spawns this binary's embed-serve; returns its pid once it listens.
Result<pid_t> SpawnService(const BenchFlags& f, const std::string& socket, const std::string& uva,
                           const std::string& overlap) {
  std::string ready = socket + ".ready";
  ::unlink(ready.c_str());
  std::vector<std::string> args = {"/proc/self/exe",
                                   "embed-serve",
                                   "--socket",
                                   socket,
                                   "--ready-file",
                                   ready,
                                   "--synthetic-rows",
                                   std::to_string(f.synthetic_rows),
                                   "--threads",
                                   std::to_string(f.threads),
                                   "--chunk-tokens",
                                   std::to_string(f.chunk_tokens),
                                   "--uva",
                                   uva,
                                   "--copy-min-kib",
                                   std::to_string(f.copy_min_kib),
                                   "--overlap",
                                   overlap,
                                   "--pump-cpus",
                                   std::to_string(f.pump_cpus),
                                   "--layers"};
  const std::vector<std::string> model = ModelArgs(f.model);
  args.insert(args.begin() + 6, model.begin(), model.end());
  if (f.streaming_stores) args.insert(args.end() - 1, "--streaming-stores");
  args.insert(args.end() - 1, {"--staging-stores", f.staging_stores});
  if (f.pump_host_copies) args.insert(args.end() - 1, "--pump-host-copies");
  for (int l = 0; l < MaxLayers(f); ++l) args.push_back(std::to_string(l));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(2, 1);  // the service's own report goes to stderr; stdout holds the tables
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  if (pid < 0) return Status(Code::kInternal, "fork failed");
  auto until = Clock::now() + std::chrono::seconds(600);  // a large synthetic table takes a while
  while (::access(ready.c_str(), F_OK) != 0) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return Status(Code::kInternal, "embed-serve exited before listening");
    if (Clock::now() > until) return Status(Code::kDeadlineExceeded, "embed-serve did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::unlink(ready.c_str());
  return pid;
}

struct Baselines {
  // copy: the step's bytes copied, one copy per layer: a memcpy (host), pinned H2D (cuda).
  double gather_ms = 0, naive_ms = 0, copy_ms = 0;
};

// The same steps gathered in this process: Gatherer, naive loop, and the copy of the step's
// bytes; [shape][index into f.layers].
Result<std::vector<std::vector<Baselines>>> RunBaselines(
    const BenchFlags& f, const embed::Config& c, const std::vector<StepShape>& shapes,
    const std::vector<svc::ServedLayer>& layers, uint64_t token_bytes, bool cuda,
    Progress& progress) {
  embed::GatherOptions go;
  go.threads = f.threads;
  go.chunk_tokens = f.chunk_tokens;
  go.streaming_stores = f.streaming_stores;
  FERRY_ASSIGN_OR_RETURN(auto gatherer, embed::Gatherer::Create(go));
  uint32_t max_tokens = 0;
  for (auto& s : shapes) max_tokens = std::max(max_tokens, s.tokens);
  std::vector<uint8_t> dst(max_tokens * token_bytes), out(max_tokens * token_bytes);
  const uint64_t row_bytes = layers[0].table->row_bytes();
  void *pinned = nullptr, *dev = nullptr;
  std::unique_ptr<gpu::Stream> stream;
  struct Free {
    void** pinned;
    void** dev;
    ~Free() {
      if (*dev != nullptr) (void)gpu::DeviceFree(*dev);
      if (*pinned != nullptr) (void)gpu::PinnedFree(*pinned);
    }
  } free_buffers{&pinned, &dev};
  if (cuda) {
    FERRY_ASSIGN_OR_RETURN(stream, gpu::Stream::Create(0));
    FERRY_ASSIGN_OR_RETURN(pinned, gpu::PinnedAlloc(dst.size()));
    FERRY_ASSIGN_OR_RETURN(dev, gpu::DeviceAlloc(0, dst.size()));
  }
  std::vector<std::vector<Baselines>> result;
  for (const StepShape& s : shapes) {
    result.emplace_back();
    for (const int n_layers : f.layers) {
      progress.Step(fmt::format("in-process {}x{}, {} layer(s)", s.tokens, s.reqs, n_layers));
      Inputs in = MakeInputs(s, c, s.tokens);
      embed::StepInput step{in.tokens, in.qsl, in.ctx};
      std::span<const svc::ServedLayer> used(layers.data(), static_cast<size_t>(n_layers));
      std::vector<double> gather_ms, naive_ms, copy_ms;
      for (int it = 0; it < f.iters; ++it) {
        auto t0 = Clock::now();
        for (const auto& l : used)
          FERRY_RETURN_IF_ERROR(gatherer->GatherStep(
              l.layout, *l.table, step, std::span<uint8_t>(dst.data(), s.tokens * token_bytes)));
        gather_ms.push_back(Ms(Clock::now() - t0));
      }
      std::vector<uint64_t> ids(static_cast<size_t>(s.tokens) * layers[0].layout.num_heads());
      for (int it = 0; it < std::max(1, f.iters / 4); ++it) {
        auto t0 = Clock::now();
        for (const auto& l : used) {
          FERRY_RETURN_IF_ERROR(embed::ComputeRowIds(l.layout, step, ids));
          for (size_t i = 0; i < ids.size(); ++i)
            std::memcpy(dst.data() + i * row_bytes, l.table->Row(ids[i]), row_bytes);
          std::memcpy(out.data(), dst.data(), s.tokens * token_bytes);
        }
        naive_ms.push_back(Ms(Clock::now() - t0));
      }
      for (int it = 0; cuda && it < f.iters + 1; ++it) {
        auto t0 = Clock::now();
        for (int l = 0; l < n_layers; ++l)
          FERRY_RETURN_IF_ERROR(stream->CopyAsync(dev, pinned, s.tokens * token_bytes));
        FERRY_RETURN_IF_ERROR(stream->Sync(std::chrono::seconds(30)));
        if (it > 0) copy_ms.push_back(Ms(Clock::now() - t0));
      }
      // Host mode: the step's bytes, one memcpy per layer (from the gathered rows to an output
      // the size of the client's; the first pass faults the pages in and is not timed).
      for (int it = 0; !cuda && it < f.iters + 1; ++it) {
        auto t0 = Clock::now();
        for (int l = 0; l < n_layers; ++l)
          std::memcpy(out.data(), dst.data(), static_cast<size_t>(s.tokens) * token_bytes);
        if (it > 0) copy_ms.push_back(Ms(Clock::now() - t0));
      }
      Baselines b;
      b.gather_ms = Summarize(gather_ms).median_ms;
      b.naive_ms = Summarize(naive_ms).median_ms;
      b.copy_ms = Summarize(copy_ms).median_ms;
      result.back().push_back(b);
    }
  }
  return result;
}

struct ServiceRun {
  Stats step;
  svc::ServerStats stats;  // the timed steps only
};

// One service process with --uva `uva` and --overlap `overlap`: every layer count's and
// shape's steps, timed from the request to DONE visible, and the service's own timings of them;
// [shape][index into f.layers].
Result<std::vector<std::vector<ServiceRun>>> RunService(const BenchFlags& f, const embed::Config& c,
                                                        const std::vector<StepShape>& shapes,
                                                        uint64_t token_bytes, bool cuda,
                                                        const std::string& uva,
                                                        const std::string& overlap,
                                                        Progress& progress) {
  uint32_t max_tokens = 0, max_reqs = 0;
  for (auto& s : shapes) {
    max_tokens = std::max(max_tokens, s.tokens);
    max_reqs = std::max(max_reqs, s.reqs);
  }
  std::string socket = "/tmp/ferry-bench-embed-" + std::to_string(::getpid()) + ".sock";
  FERRY_ASSIGN_OR_RETURN(pid_t service, SpawnService(f, socket, uva, overlap));
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  } reap{service};
  svc::ClientOptions o;
  o.socket_path = socket;
  o.max_tokens = max_tokens;
  o.max_reqs = max_reqs;
  o.context_len = static_cast<uint64_t>(f.model.ngram - 1);
  o.token_bytes = token_bytes;
  o.mode = cuda ? svc::OutputMode::kCuda : svc::OutputMode::kHost;
  o.tp_size = static_cast<uint32_t>(f.tp);
  std::vector<std::unique_ptr<svc::Client>> ranks;
  std::unique_ptr<gpu::Stream> gpu_stream;
  if (cuda) {
    FERRY_ASSIGN_OR_RETURN(gpu_stream, gpu::Stream::Create(0));
  }
  void* stream = gpu_stream ? gpu_stream->handle() : nullptr;
  // The stream's work done, seen within a few microseconds (no sleeping poll).
  auto sync = [&](Clock::duration d) -> Status {
    return gpu_stream->Sync(std::chrono::duration_cast<std::chrono::nanoseconds>(d));
  };
  const Clock::duration kWait = std::chrono::seconds(30);
  // auto: its probes (both paths, a few steps each) run before the timed steps.
  const int warmup = uva == "auto" ? 8 : 1;
  std::vector<std::vector<ServiceRun>> runs(shapes.size());
  for (const int n_layers : f.layers) {
    // Every tensor-parallel rank of one data-parallel rank, registered for the first n_layers
    // layers; rank 0 sends, all wait.
    ranks.clear();
    o.layers.clear();
    for (int l = 0; l < n_layers; ++l) o.layers.push_back(static_cast<uint32_t>(l));
    for (int tp = 0; tp < f.tp; ++tp) {
      o.tp_rank = static_cast<uint32_t>(tp);
      FERRY_ASSIGN_OR_RETURN(auto r, svc::Client::Create(o));
      ranks.push_back(std::move(r));
    }
    svc::Client* client = ranks[0].get();
    for (size_t si = 0; si < shapes.size(); ++si) {
      const StepShape& s = shapes[si];
      progress.Step(fmt::format("service uva {} overlap {} {}x{}, {} layer(s)", uva, overlap,
                                s.tokens, s.reqs, n_layers));
      Inputs in = MakeInputs(s, c, s.tokens);
      std::vector<double> service_ms;
      for (int it = 0; it < f.iters + warmup; ++it) {
        if (it == warmup) {
          FERRY_RETURN_IF_ERROR(svc::QueryStats(socket, true, kWait).status());
        }
        std::memcpy(client->input_ids().data(), in.tokens.data(), in.tokens.size() * 4);
        std::memcpy(client->query_start_loc().data(), in.qsl.data(), in.qsl.size() * 4);
        std::memcpy(client->ngram_context().data(), in.ctx.data(), in.ctx.size() * 4);
        auto t0 = Clock::now();
        FERRY_RETURN_IF_ERROR(client->PrepareForward(s.reqs, s.tokens, false, stream));
        for (auto& r : ranks)
          for (size_t slot = 0; slot < r->slots(); ++slot)
            FERRY_RETURN_IF_ERROR(r->Wait(slot, stream));
        if (cuda) FERRY_RETURN_IF_ERROR(sync(kWait));
        auto t1 = Clock::now();
        for (auto& r : ranks) FERRY_RETURN_IF_ERROR(r->ReleaseOutputs(stream));
        if (cuda) FERRY_RETURN_IF_ERROR(sync(kWait));
        if (it >= warmup) service_ms.push_back(Ms(t1 - t0));
      }
      ServiceRun run;
      run.step = Summarize(service_ms);
      // The reply of the last step may still be on its way: the step counters can lag by one.
      FERRY_ASSIGN_OR_RETURN(run.stats, svc::QueryStats(socket, false, kWait));
      runs[si].push_back(std::move(run));
    }
  }
  return runs;
}

Status Run(const BenchFlags& f) {
  embed::Config c = ToConfig(f.model);
  std::vector<StepShape> shapes;
  for (const auto& s : f.steps) {
    FERRY_ASSIGN_OR_RETURN(StepShape shape, ParseStep(s));
    shapes.push_back(shape);
  }
  FERRY_RETURN_IF_ERROR(RangeFlag("--iters", f.iters, 1, 1 << 20));
  if (f.layers.empty()) return Status(Code::kInvalidArgument, "--layers needs a layer count");
  for (int l : f.layers) FERRY_RETURN_IF_ERROR(RangeFlag("--layers", l, 1, svc::kMaxLayers));
  FERRY_RETURN_IF_ERROR(RangeFlag("--tp", f.tp, 1, svc::kMaxTpSize));
  FERRY_RETURN_IF_ERROR(RangeFlag("--threads", f.threads, 1, embed::kMaxGatherThreads));
  FERRY_RETURN_IF_ERROR(RangeFlag("--chunk-tokens", f.chunk_tokens, 1, embed::kMaxChunkTokens));
  FERRY_RETURN_IF_ERROR(RangeFlag("--pump-cpus", f.pump_cpus, -1, svc::kMaxPumpCpus));
  FERRY_RETURN_IF_ERROR(RangeFlag(
      "--copy-min-kib", static_cast<int64_t>(std::min<uint64_t>(f.copy_min_kib, INT64_MAX)), 1,
      1 << 30));
  if (f.overlap.empty()) return Status(Code::kInvalidArgument, "--overlap needs on or off");
  const bool cuda = f.kind == "cuda";
  std::vector<std::string> modes = f.uva;
  if (modes.empty())
    modes =
        cuda ? std::vector<std::string>{"off", "always", "auto"} : std::vector<std::string>{"off"};
  for (const auto& m : modes) FERRY_RETURN_IF_ERROR(svc::ParseUvaMode(m).status());
  // One service process per UVA mode and overlap setting, run one after the other.
  struct Variant {
    std::string uva, overlap;
  };
  std::vector<Variant> variants;
  for (const auto& m : modes)
    for (const auto& ov : f.overlap) variants.push_back({m, ov});
  FERRY_RETURN_IF_ERROR(CheckJsonTarget(f.json));
  std::FILE* out = TextStream(f.json);
  // Building the tables and spawning a service per variant takes a while: a bar on a terminal.
  Progress progress("bench-embed", shapes.size() * f.layers.size() * (1 + variants.size()));

  // The same layers in this process for the side-by-side gathers.
  std::vector<uint32_t> layer_ids;
  for (int l = 0; l < MaxLayers(f); ++l) layer_ids.push_back(static_cast<uint32_t>(l));
  FERRY_ASSIGN_OR_RETURN(auto layers, svc::MakeServedLayers(c, layer_ids, embed::Dtype::kBf16, {},
                                                            f.synthetic_rows, nullptr));
  const uint64_t token_bytes =
      static_cast<uint64_t>(layers[0].layout.num_heads()) * layers[0].table->row_bytes();
  FERRY_ASSIGN_OR_RETURN(auto base,
                         RunBaselines(f, c, shapes, layers, token_bytes, cuda, progress));
  layers.clear();  // the service processes hold their own tables

  std::vector<std::vector<std::vector<ServiceRun>>> runs;  // [variant][shape][layer count]
  for (const auto& v : variants) {
    FERRY_ASSIGN_OR_RETURN(auto r,
                           RunService(f, c, shapes, token_bytes, cuda, v.uva, v.overlap, progress));
    runs.push_back(std::move(r));
  }
  progress.Done();
  const std::string copy_name = cuda ? "pinned H2D copy ms" : "memcpy ms";
  fmt::print(out,
             "| step (tokens x requests) | layers | tp | uva | overlap | service step ms "
             "(median / min) | layer steps cpu / uva | in-process Gatherer ms | naive 1-thread "
             "ms | {} | x copy | service GB/s |\n",
             copy_name);
  fmt::print(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  auto bucket_only = [](svc::ServerStats st, uint32_t tokens) {
    std::erase_if(st.buckets,
                  [&](const svc::BucketStats& b) { return b.bucket != svc::TokenBucket(tokens); });
    return st;
  };
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const StepShape& s = shapes[i];
    for (size_t li = 0; li < f.layers.size(); ++li) {
      const int n_layers = f.layers[li];
      const Baselines& b = base[i][li];
      for (size_t v = 0; v < variants.size(); ++v) {
        const ServiceRun& r = runs[v][i][li];
        uint64_t cpu = 0, uva = 0;
        for (const auto& bk : r.stats.buckets)
          if (bk.bucket == svc::TokenBucket(s.tokens)) cpu = bk.cpu_steps, uva = bk.uva_steps;
        const double gbps =
            static_cast<double>(s.tokens) * token_bytes * n_layers / (r.step.median_ms * 1e6);
        const double x_copy = b.copy_ms > 0 ? r.step.median_ms / b.copy_ms : 0;
        nlohmann::ordered_json row = {
            {"tokens", s.tokens},
            {"requests", s.reqs},
            {"layers", n_layers},
            {"tp", f.tp},
            {"uva", variants[v].uva},
            {"overlap", variants[v].overlap},
            {"service_step_ms",
             {{"median", r.step.median_ms}, {"min", r.step.min_ms}, {"mean", r.step.mean_ms}}},
            {"cpu_steps", cpu},
            {"uva_steps", uva},
            {"in_process_gatherer_ms", b.gather_ms},
            {"naive_one_thread_ms", b.naive_ms},
            {cuda ? "pinned_h2d_copy_ms" : "memcpy_ms", b.copy_ms},
            {"service_over_copy", x_copy},
            {"service_gbps", gbps},
            {"service_stats", EmbedStatsJson(bucket_only(r.stats, s.tokens))}};
        rows.push_back(std::move(row));
        fmt::print(out,
                   "| {} x {} | {} | {} | {} | {} | {:.3f} / {:.3f} | {} / {} | {:.3f} | {:.3f} | "
                   "{:.3f} | {:.2f} | {:.2f} |\n",
                   s.tokens, s.reqs, n_layers, f.tp, variants[v].uva, variants[v].overlap,
                   r.step.median_ms, r.step.min_ms, cpu, uva, b.gather_ms, b.naive_ms, b.copy_ms,
                   x_copy, gbps);
      }
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t li = 0; li < f.layers.size(); ++li)
      for (size_t v = 0; v < variants.size(); ++v) {
        fmt::print(out,
                   "\nservice phases, {} x {}, {} layer(s), uva {}, overlap {} (median (mean) us "
                   "per layer step; the bucket of this step shape):\n",
                   shapes[i].tokens, shapes[i].reqs, f.layers[li], variants[v].uva,
                   variants[v].overlap);
        fmt::print(out, "{}",
                   svc::FormatStats(bucket_only(runs[v][i][li].stats, shapes[i].tokens)));
      }
  std::fflush(out);
  nlohmann::ordered_json config = {{"kind", f.kind},
                                   {"iters", f.iters},
                                   {"threads", f.threads},
                                   {"pump_cpus", f.pump_cpus},
                                   {"pump_host_copies", f.pump_host_copies},
                                   {"chunk_tokens", f.chunk_tokens},
                                   {"synthetic_rows", f.synthetic_rows},
                                   {"base_vocab", f.model.base_vocab},
                                   {"embed_dim", f.model.embed_dim},
                                   {"heads", f.model.heads},
                                   {"ngram", f.model.ngram},
                                   {"token_bytes", token_bytes}};
  nlohmann::ordered_json doc = {{"ferry_version", std::string(Version())}, {"config", config}, {"rows", rows}};
  return WriteJson(f.json, doc);
}

}  // namespace

void AddEmbedBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "bench-embed", "Time embedding-offload service steps against in-process gathers");
  auto f = std::make_shared<BenchFlags>();
  AddModelFlags(cmd, &f->model);
  cmd->add_option("--synthetic-rows", f->synthetic_rows, "Synthetic table rows (0: all)")
      ->capture_default_str();
  cmd->add_option("--layers", f->layers,
                  "Layers per step; several (1,4) run each, from one service serving the most")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--overlap", f->overlap,
                  "The service's layer overlap, side by side: on, off or both (on,off)")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--pump-cpus", f->pump_cpus,
                  "The service's CPUs kept for its copy pumps (-1: auto; 0: no pinning)")
      ->capture_default_str();
  cmd->add_flag("--pump-host-copies", f->pump_host_copies,
                "Host mode, --tp 2 or more: the other ranks' copies through the copy pump (the "
                "CUDA path's pipeline)");
  cmd->add_option("--tp", f->tp, "Tensor-parallel ranks that receive every row")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "Gather threads (service and in-process)")
      ->capture_default_str();
  cmd->add_option("--chunk-tokens", f->chunk_tokens, "Tokens per gather/copy chunk")
      ->capture_default_str();
  cmd->add_flag("--streaming-stores", f->streaming_stores,
               "Non-temporal stores in the gathers into host memory (service and in-process)");
  cmd->add_option("--staging-stores", f->staging_stores,
                  "The service's stores into its pinned staging (CUDA outputs): streaming or normal")
      ->check(CLI::IsMember({"streaming", "normal"}))
      ->capture_default_str();
  cmd->add_option("--iters", f->iters, "Timed steps per shape")->capture_default_str();
  cmd->add_option("--kind", f->kind, "Outputs: host (CPU-only mode) or cuda")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--step", f->steps, "Step shapes TOKENSxREQUESTS")->capture_default_str();
  cmd->add_option("--uva", f->uva,
                  "Service UVA modes run side by side (off, always, auto; default: off for "
                  "host, all three for cuda)");
  cmd->add_option("--copy-min-kib", f->copy_min_kib, "The service's least KiB per copy to the GPU")
      ->capture_default_str();
  AddJsonFlag(cmd, &f->json, "Every step shape and UVA mode, with the service's phase timings");
  cmd->callback([f, exit_code] {
    Status s = Run(*f);
    *exit_code = s.ok() ? 0 : Fail(kCmd, s);
  });
}

}  // namespace ferry::tools
