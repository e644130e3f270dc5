// `ferry bench-embed`: the embedding-offload service's step time, from the request sent to
// DONE visible for every layer, measured through a real `ferry embed-serve` process (this
// binary, spawned) and the client library, for the model's head layout. Side by side, in the
// same run: the same step gathered in this process by the Gatherer alone (no protocol, no
// copies: what the service adds is the difference), and a naive single-threaded baseline
// (ComputeRowIds, then one memcpy per row, no prefetch, then one copy to the output).
// --kind cuda puts the outputs in GPU memory (CUDA mode).
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
#include "embed/config.h"
#include "embed/gather.h"
#include "embed/row_ids.h"
#include "embed/service/client.h"
#include "embed/service/gpu_ops.h"
#include "embed/service/served_layers.h"
#include "embed/table.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;
namespace svc = embed::service;
constexpr std::string_view kCmd = "bench-embed";

struct BenchFlags {
  int64_t vocab = 248320;
  int64_t eos = 1;
  int ngram = 3;
  int heads = 8;
  int64_t embed_dim = 2560;
  uint64_t base_vocab = 20000000;
  uint64_t padding = 128;
  uint64_t synthetic_rows = 0;
  int layers = 1;
  int tp = 1;
  int threads = 2;
  int64_t chunk_tokens = 64;
  int iters = 20;
  std::string kind = "host";
  std::vector<std::string> steps = {"8192x8", "256x256"};
};

struct StepShape {
  uint32_t tokens = 0, reqs = 0;
};

Result<StepShape> ParseStep(const std::string& s) {
  StepShape out;
  unsigned t = 0, r = 0;
  if (std::sscanf(s.c_str(), "%ux%u", &t, &r) != 2 || t == 0 || r == 0 || r > t)
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

// Spawns this binary's embed-serve; returns its pid once it listens.
Result<pid_t> SpawnService(const BenchFlags& f, const std::string& socket) {
  std::string ready = socket + ".ready";
  ::unlink(ready.c_str());
  std::vector<std::string> args = {"/proc/self/exe",
                                   "embed-serve",
                                   "--socket",
                                   socket,
                                   "--ready-file",
                                   ready,
                                   "--vocab",
                                   std::to_string(f.vocab),
                                   "--eos",
                                   std::to_string(f.eos),
                                   "--ngram",
                                   std::to_string(f.ngram),
                                   "--heads",
                                   std::to_string(f.heads),
                                   "--embed-dim",
                                   std::to_string(f.embed_dim),
                                   "--base-vocab",
                                   std::to_string(f.base_vocab),
                                   "--padding",
                                   std::to_string(f.padding),
                                   "--synthetic-rows",
                                   std::to_string(f.synthetic_rows),
                                   "--threads",
                                   std::to_string(f.threads),
                                   "--chunk-tokens",
                                   std::to_string(f.chunk_tokens),
                                   "--layers"};
  for (int l = 0; l < f.layers; ++l) args.push_back(std::to_string(l));
  pid_t pid = ::fork();
  if (pid == 0) {
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

Status Run(const BenchFlags& f) {
  embed::Config c;
  c.vocab_size = f.vocab;
  c.eos_id = f.eos;
  c.ngram_size = f.ngram;
  c.heads_per_ngram = f.heads;
  c.embed_dim = f.embed_dim;
  c.base_vocab = f.base_vocab;
  c.row_padding = f.padding;
  std::vector<StepShape> shapes;
  for (const auto& s : f.steps) {
    FERRY_ASSIGN_OR_RETURN(StepShape shape, ParseStep(s));
    shapes.push_back(shape);
  }
  if (f.iters < 1 || f.layers < 1 || f.tp < 1 || f.tp > 64)
    return Status(Code::kInvalidArgument, "--iters and --layers >= 1, --tp in [1, 64]");
  const bool cuda = f.kind == "cuda";
  uint32_t max_tokens = 0, max_reqs = 0;
  for (auto& s : shapes) {
    max_tokens = std::max(max_tokens, s.tokens);
    max_reqs = std::max(max_reqs, s.reqs);
  }
  std::string socket = "/tmp/ferry-bench-embed-" + std::to_string(::getpid()) + ".sock";
  FERRY_ASSIGN_OR_RETURN(pid_t service, SpawnService(f, socket));
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  } reap{service};

  // The same layers in this process for the side-by-side gathers.
  std::vector<uint32_t> layer_ids;
  for (int l = 0; l < f.layers; ++l) layer_ids.push_back(static_cast<uint32_t>(l));
  FERRY_ASSIGN_OR_RETURN(auto layers, svc::MakeServedLayers(c, layer_ids, embed::Dtype::kBf16, {},
                                                            f.synthetic_rows, nullptr));
  const uint64_t token_bytes =
      static_cast<uint64_t>(layers[0].layout.num_heads()) * layers[0].table->row_bytes();
  svc::ClientOptions o;
  o.socket_path = socket;
  o.max_tokens = max_tokens;
  o.max_reqs = max_reqs;
  o.context_len = static_cast<uint64_t>(f.ngram - 1);
  o.token_bytes = token_bytes;
  o.layers = layer_ids;
  o.mode = cuda ? svc::OutputMode::kCuda : svc::OutputMode::kHost;
  o.tp_size = static_cast<uint32_t>(f.tp);
  // Every tensor-parallel rank of one data-parallel rank; rank 0 sends, all wait.
  std::vector<std::unique_ptr<svc::Client>> ranks;
  for (int tp = 0; tp < f.tp; ++tp) {
    o.tp_rank = static_cast<uint32_t>(tp);
    FERRY_ASSIGN_OR_RETURN(auto r, svc::Client::Create(o));
    ranks.push_back(std::move(r));
  }
  svc::Client* client = ranks[0].get();
  void* stream = nullptr;
  if (cuda) {
    FERRY_ASSIGN_OR_RETURN(stream, svc::gpu::StreamCreate());
  }

  embed::GatherOptions go;
  go.threads = f.threads;
  go.chunk_tokens = f.chunk_tokens;
  FERRY_ASSIGN_OR_RETURN(auto gatherer, embed::Gatherer::Create(go));
  std::vector<uint8_t> dst(max_tokens * token_bytes), out(max_tokens * token_bytes);
  const uint64_t row_bytes = layers[0].table->row_bytes();

  fmt::print(
      "| step (tokens x requests) | layers | service step ms (median / min) | "
      "in-process Gatherer ms | naive 1-thread ms | service GB/s |\n");
  fmt::print("| --- | --- | --- | --- | --- | --- |\n");
  for (const StepShape& s : shapes) {
    Inputs in = MakeInputs(s, c, s.tokens);
    embed::StepInput step{in.tokens, in.qsl, in.ctx};
    std::vector<double> service_ms, gather_ms, naive_ms;
    for (int it = 0; it < f.iters + 1; ++it) {
      std::memcpy(client->input_ids().data(), in.tokens.data(), in.tokens.size() * 4);
      std::memcpy(client->query_start_loc().data(), in.qsl.data(), in.qsl.size() * 4);
      std::memcpy(client->ngram_context().data(), in.ctx.data(), in.ctx.size() * 4);
      auto t0 = Clock::now();
      FERRY_RETURN_IF_ERROR(client->PrepareForward(s.reqs, s.tokens, false, stream));
      for (auto& r : ranks)
        for (size_t slot = 0; slot < r->slots(); ++slot)
          FERRY_RETURN_IF_ERROR(r->Wait(slot, stream));
      if (cuda)
        FERRY_RETURN_IF_ERROR(
            svc::gpu::StreamSync(stream, Deadline::After(std::chrono::seconds(30))));
      auto t1 = Clock::now();
      for (auto& r : ranks) FERRY_RETURN_IF_ERROR(r->ReleaseOutputs(stream));
      if (cuda)
        FERRY_RETURN_IF_ERROR(
            svc::gpu::StreamSync(stream, Deadline::After(std::chrono::seconds(30))));
      if (it > 0) service_ms.push_back(Ms(t1 - t0));  // the first step warms up
    }
    for (int it = 0; it < f.iters; ++it) {
      auto t0 = Clock::now();
      for (const auto& l : layers)
        FERRY_RETURN_IF_ERROR(gatherer->GatherStep(
            l.layout, *l.table, step, std::span<uint8_t>(dst.data(), s.tokens * token_bytes)));
      gather_ms.push_back(Ms(Clock::now() - t0));
    }
    std::vector<uint64_t> ids(static_cast<size_t>(s.tokens) * layers[0].layout.num_heads());
    for (int it = 0; it < std::max(1, f.iters / 4); ++it) {
      auto t0 = Clock::now();
      for (const auto& l : layers) {
        FERRY_RETURN_IF_ERROR(embed::ComputeRowIds(l.layout, step, ids));
        for (size_t i = 0; i < ids.size(); ++i)
          std::memcpy(dst.data() + i * row_bytes, l.table->Row(ids[i]), row_bytes);
        std::memcpy(out.data(), dst.data(), s.tokens * token_bytes);
      }
      naive_ms.push_back(Ms(Clock::now() - t0));
    }
    Stats sv = Summarize(service_ms), ga = Summarize(gather_ms), na = Summarize(naive_ms);
    double gbps = static_cast<double>(s.tokens) * token_bytes * f.layers / (sv.median_ms * 1e6);
    fmt::print("| {} x {} | {} | {:.3f} / {:.3f} | {:.3f} | {:.3f} | {:.2f} |\n", s.tokens, s.reqs,
               f.layers, sv.median_ms, sv.min_ms, ga.median_ms, na.median_ms, gbps);
  }
  if (stream != nullptr) (void)svc::gpu::StreamDestroy(stream);
  return Status::Ok();
}

}  // namespace

void AddEmbedBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "bench-embed", "Time embedding-offload service steps against in-process gathers");
  auto f = std::make_shared<BenchFlags>();
  cmd->add_option("--vocab", f->vocab, "V")->capture_default_str();
  cmd->add_option("--ngram", f->ngram, "N")->capture_default_str();
  cmd->add_option("--heads", f->heads, "H")->capture_default_str();
  cmd->add_option("--embed-dim", f->embed_dim, "E")->capture_default_str();
  cmd->add_option("--base-vocab", f->base_vocab, "B (smaller: a smaller synthetic table)")
      ->capture_default_str();
  cmd->add_option("--padding", f->padding, "P")->capture_default_str();
  cmd->add_option("--synthetic-rows", f->synthetic_rows, "Synthetic table rows (0: all)")
      ->capture_default_str();
  cmd->add_option("--layers", f->layers, "Layers per step")->capture_default_str();
  cmd->add_option("--tp", f->tp, "Tensor-parallel ranks that receive every row")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "Gather threads (service and in-process)")
      ->capture_default_str();
  cmd->add_option("--chunk-tokens", f->chunk_tokens, "Tokens per gather/copy chunk")
      ->capture_default_str();
  cmd->add_option("--iters", f->iters, "Timed steps per shape")->capture_default_str();
  cmd->add_option("--kind", f->kind, "Outputs: host (CPU-only mode) or cuda")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--step", f->steps, "Step shapes TOKENSxREQUESTS")->capture_default_str();
  cmd->callback([f, exit_code] {
    Status s = Run(*f);
    *exit_code = s.ok() ? 0 : Fail(kCmd, s);
  });
}

}  // namespace ferry::tools
