#include "pd_worker.h"

#include <fmt/format.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "ferry/engine.h"
#include "ferry/gpu.h"
#include "ferry/kv.h"
#include "pd_arrivals.h"
#include "pd_cache.h"
#include "pd_channel.h"
#include "pd_config.h"

namespace ferry::tools::pd {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

struct Job {
  std::string req;
  uint64_t n = 0;
  uint64_t tokens = 0;
  uint64_t first_token = 0;  // decode: the prefix hit; `blocks` hold the tokens from it on
  std::vector<uint64_t> blocks;
};

// A request this worker was given and the connector has not ended yet: its blocks are busy.
struct Held {
  uint64_t n = 0;
  uint64_t tokens = 0;
  uint64_t first_token = 0;
  std::vector<uint64_t> blocks;
  int64_t last_layer_ns = 0;  // decode, read mode: when WaitLayer saw the last layer
};

std::string_view OutcomeName(kv::Outcome o) {
  switch (o) {
    case kv::Outcome::kDone:
      return "done";
    case kv::Outcome::kFailed:
      return "failed";
    case kv::Outcome::kAborted:
      return "aborted";
  }
  return "?";
}

json StatsJson(const kv::ConnectorStats& s) {
  return {{"requests_done", s.requests_done},
          {"requests_failed", s.requests_failed},
          {"requests_aborted", s.requests_aborted},
          {"layers_written", s.layers_written},
          {"layers_read", s.layers_read},
          {"layers_deferred", s.layers_deferred},
          {"bytes", s.bytes},
          {"ops_posted", s.ops_posted},
          {"messages_sent", s.messages_sent},
          {"messages_received", s.messages_received},
          {"messages_rejected", s.messages_rejected},
          {"blocks_expired", s.blocks_expired},
          {"checksum_failures", s.checksum_failures},
          {"peers_lost", s.peers_lost}};
}

class Worker {
 public:
  explicit Worker(int fd) : ch_(fd) {}
  int Run();

 private:
  Status Setup();
  // Handles one message from the router; false once the run is over.
  bool Handle(const json& m);
  Status Admit(const json& m, Job* job);
  void Report(json m) {
    if (Status s = ch_.Send(m); !s.ok()) Log("cannot report to the router: " + s.ToString());
  }
  void Log(const std::string& what) { fmt::print(stderr, "ferry pd-worker {}: {}\n", name_, what); }
  void EndNow(const std::string& req, const std::string& why);
  void ComputeLoop();
  // Runs the prefill of `job` layer by layer; false when the router cancelled it (an abort came
  // while it ran), with *saved set when the connector already knows the request.
  Status Compute(const Job& job, bool* cancelled, bool* saved);
  // Handles the router's abort of `req`.
  void AbortRequest(const std::string& req);
  void ReadLoop();
  void FinishLoop();
  // Decode: verifies each request done (FinishLoop queues them) and reports it, so that a long
  // check does not delay the end time taken for the requests that end meanwhile.
  void CheckLoop();
  void Stop(milliseconds wait);

  LineChannel ch_;
  WorkerConfig cfg_;
  Preset preset_;
  std::string name_ = "?";
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<KvCache> cache_;
  // --compute gpu (prefill): the layers' stream and one event per layer, which the connector
  // waits on before it posts the layer's write. Declared before conn_ so that they outlive it.
  std::unique_ptr<gpu::Stream> stream_;
  std::vector<std::unique_ptr<gpu::Event>> layer_events_;
  std::unique_ptr<kv::Connector> conn_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Held> held_;
  std::deque<Job> compute_q_;
  std::deque<Job> read_q_;
  struct Ended {
    std::string req;
    Held held;
    json report;  // the "end" message, without the check's fields
  };
  std::deque<Ended> check_q_;
  std::string computing_;  // the request ComputeLoop runs, "" when none
  bool cancel_ = false;    // the router aborted `computing_`
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

Status Worker::Setup() {
  std::vector<json> lines;
  for (int i = 0; i < 100 && lines.empty(); ++i)
    FERRY_RETURN_IF_ERROR(ch_.Receive(&lines, milliseconds(100)));
  if (lines.empty() || TypeOf(lines[0]) != "config" || !lines[0].contains("config"))
    return Status(Code::kInvalidArgument, "the router sent no config");
  FERRY_ASSIGN_OR_RETURN(cfg_, WorkerConfig::FromJson(lines[0]["config"].dump()));
  name_ = fmt::format("{}/dp{}/tp{}", cfg_.instance, cfg_.dp_rank, cfg_.tp_rank);
  FERRY_ASSIGN_OR_RETURN(preset_, FindPreset(cfg_.model));
  preset_.layers = cfg_.layers;
  kv::CacheLayout id;
  id.model = preset_.name;
  id.dtype_bytes = preset_.dtype_bytes;
  id.head_dim = preset_.head_dim;
  id.total_kv_heads = preset_.mla ? 1 : preset_.kv_heads;
  id.mla = preset_.mla;
  id.num_layers = preset_.layers;
  id.tp_rank = cfg_.tp_rank;
  id.tp_size = cfg_.tp_size;
  id.dp_rank = cfg_.dp_rank;
  id.block_tokens = cfg_.block_tokens;
  id.num_blocks = cfg_.blocks;
  FERRY_ASSIGN_OR_RETURN(kv::TensorOrder order, kv::ParseTensorOrder(cfg_.layout));
  FERRY_ASSIGN_OR_RETURN(kv::CacheLayout layout, kv::MakeLayout(id, order));

  // The FERRY_* environment first (docs/configuration.md: a secret, timeouts, ucx options), then
  // what this worker must be: its key, its transport, one copy thread unless the environment
  // says otherwise (many workers share the host's cores), and no fixed metrics port (many
  // workers cannot share one; -1, any free port, stays).
  FERRY_ASSIGN_OR_RETURN(EngineOptions eo, EngineOptions::FromEnv());
  eo.key = fmt::format("pd-{}-dp{}-tp{}-{}", cfg_.instance, cfg_.dp_rank, cfg_.tp_rank, getpid());
  eo.transports = EngineTransports(cfg_.transport);
  if (eo.copy_threads == 0) eo.copy_threads = 1;
  if (eo.metrics_port != -1) eo.metrics_port = 0;
  FERRY_ASSIGN_OR_RETURN(engine_, Engine::Create(eo));
  const HeadSlice heads = HeadsOf(id.total_kv_heads, id.mla, id.tp_size, id.tp_rank);
  FERRY_ASSIGN_OR_RETURN(cache_,
                         KvCache::Create(engine_.get(), layout, cfg_.gpu, cfg_.device, heads));
  if (cfg_.gpu_compute) {
    FERRY_ASSIGN_OR_RETURN(stream_, gpu::Stream::Create(cfg_.device));
    for (uint32_t l = 0; l < preset_.layers; ++l) {
      FERRY_ASSIGN_OR_RETURN(auto event, gpu::Event::Create(cfg_.device));
      layer_events_.push_back(std::move(event));
    }
  }

  kv::ConnectorOptions co;
  co.role = cfg_.prefill ? kv::Role::kProducer : kv::Role::kConsumer;
  co.mode = cfg_.read_mode ? kv::Mode::kRead : kv::Mode::kWrite;
  co.instance = cfg_.instance;
  co.transfer_timeout = milliseconds(cfg_.transfer_timeout_ms);
  co.deferred_write_timeout = co.transfer_timeout;
  // Short enough that a run with a dead peer hands every block back before it ends.
  co.abort_timeout = 2 * co.transfer_timeout;
  co.liveness_interval = milliseconds(250);
  co.checksums = cfg_.checksums;
  co.busy_poll = cfg_.busy_poll;
  FERRY_ASSIGN_OR_RETURN(
      conn_, kv::Connector::Create(engine_.get(), cache_->layout(), cache_->regions(), co));
  FERRY_ASSIGN_OR_RETURN(std::string addr, conn_->ServeHandshake());
  Report(
      {{"t", "ready"}, {"addr", addr}, {"id", conn_->id().ToString()}, {"bytes", cache_->bytes()}});
  return Status::Ok();
}

void Worker::EndNow(const std::string& req, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(req);
  }
  Report({{"t", "end"}, {"req", req}, {"outcome", "failed"}, {"why", why}, {"ns", MonotonicNs()}});
}

Status Worker::Admit(const json& m, Job* job) {
  const uint64_t bt = cfg_.block_tokens;
  if (m.contains("first_token") && !GetU64(m, "first_token", &job->first_token))
    return Status(Code::kInvalidArgument, "a malformed first token from the router");
  if (!GetString(m, "req", &job->req, kv::kMaxRequestIdBytes) || !GetU64(m, "n", &job->n) ||
      !GetU64(m, "tokens", &job->tokens) || job->tokens == 0 || job->tokens > kMaxPromptTokens ||
      job->first_token > job->tokens || (cfg_.prefill && job->first_token != 0) ||
      !GetBlocks(m, "blocks", cfg_.blocks, cfg_.blocks, &job->blocks) ||
      job->blocks.size() != (job->tokens - job->first_token + bt - 1) / bt)
    return Status(Code::kInvalidArgument, "a malformed request from the router");
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_.emplace(job->req, Held{job->n, job->tokens, job->first_token, job->blocks, 0}).second)
    return Status(Code::kAlreadyExists, "request " + job->req + " twice");
  return Status::Ok();
}

bool Worker::Handle(const json& m) {
  const std::string t = TypeOf(m);
  if (t == "peers") {
    Status s;
    if (!m.contains("addrs") || !m["addrs"].is_array())
      s = Status(Code::kInvalidArgument, "peers without addrs");
    for (const json& a : m.value("addrs", json::array())) {
      if (!s.ok()) break;
      s = a.is_string() ? conn_->AddPeerFrom(a.get<std::string>())
                        : Status(Code::kInvalidArgument, "bad address");
    }
    Report(s.ok() ? json{{"t", "peered"}} : json{{"t", "error"}, {"why", s.ToString()}});
    return true;
  }
  if (t == "prefill" || t == "expect" || t == "read") {
    Job job;
    if (Status s = Admit(m, &job); !s.ok()) {
      Log(s.ToString());
      Report({{"t", "error"}, {"why", s.ToString()}});
      return true;
    }
    if (t == "prefill") {
      std::lock_guard<std::mutex> lock(mu_);
      compute_q_.push_back(std::move(job));
      cv_.notify_all();
      return true;
    }
    Status s;
    if (t == "expect") {
      std::string producer;
      uint64_t producer_dp = 0;
      // num_tokens counts the tokens that move (0 for a full hit: the empty list holds none).
      s = GetString(m, "producer", &producer, kv::kMaxNameBytes) &&
                  GetU64(m, "producer_dp", &producer_dp) && producer_dp < kv::kMaxTpSize
              ? conn_->ExpectWrite(job.req, producer, static_cast<uint32_t>(producer_dp),
                                   job.blocks, job.tokens - job.first_token, job.first_token)
              : Status(Code::kInvalidArgument, "expect without a producer");
    } else {
      std::string hex, packed;
      auto params =
          GetString(m, "params", &hex) && FromHex(hex, &packed)
              ? kv::ReadParams::Unpack(packed)
              : Result<kv::ReadParams>(Status(Code::kInvalidArgument, "read without params"));
      s = params.ok() ? conn_->StartRead(*params, job.blocks, job.first_token) : params.status();
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        read_q_.push_back(std::move(job));
        cv_.notify_all();
        return true;
      }
    }
    if (!s.ok()) EndNow(job.req, s.ToString());
    return true;
  }
  if (t == "abort") {
    std::string req;
    if (GetString(m, "req", &req, kv::kMaxRequestIdBytes)) AbortRequest(req);
    return true;
  }
  if (t == "stop") {
    uint64_t wait_ms = 0;
    (void)GetU64(m, "wait_ms", &wait_ms);
    Stop(milliseconds(std::min<uint64_t>(wait_ms, 600'000)));
    return false;
  }
  Log("unknown message '" + t + "' from the router");
  return true;
}

void Worker::AbortRequest(const std::string& req) {
  bool known, queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    known = held_.count(req) != 0;
    // Not computed yet: it never reaches the connector, and its blocks are not touched again.
    for (auto it = compute_q_.begin(); it != compute_q_.end(); ++it) {
      if (it->req != req) continue;
      compute_q_.erase(it);
      queued = true;
      break;
    }
    if (known && !queued && computing_ == req) {  // ComputeLoop ends it after this layer
      cancel_ = true;
      return;
    }
  }
  // The connector ends a request it knows (and we report it then), as it may through the
  // consumer's allocation alone; one it never took ends here.
  if (known && !conn_->Abort(req).ok())
    EndNow(req, queued ? "aborted by the router before its prefill" : "aborted by the router");
}

Status Worker::Compute(const Job& job, bool* cancelled, bool* saved) {
  for (uint32_t layer = 0; layer < preset_.layers; ++layer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *cancelled = cancel_;
    }
    if (*cancelled) return Status::Ok();
    kv::ReadyFn ready;
    if (stream_) {
      // The layer's kernels (a spin), then its KV (what attention would have written), both on
      // the stream; the event marks the layer done, and the connector waits for it.
      FERRY_RETURN_IF_ERROR(stream_->Spin(std::chrono::microseconds(cfg_.layer_us)));
      FERRY_RETURN_IF_ERROR(
          cache_->FillLayerOn(stream_.get(), job.n, layer, job.blocks, job.tokens));
      FERRY_RETURN_IF_ERROR(layer_events_[layer]->Record(stream_->handle()));
      ready = kv::EventReady(layer_events_[layer]->handle());
    } else {
      if (cfg_.layer_us) std::this_thread::sleep_for(std::chrono::microseconds(cfg_.layer_us));
      FERRY_RETURN_IF_ERROR(cache_->FillLayer(job.n, layer, job.blocks, job.tokens));
    }
    if (!cfg_.read_mode) {
      *saved = true;
      FERRY_RETURN_IF_ERROR(conn_->SaveLayer(job.req, layer, job.blocks, std::move(ready)));
    }
  }
  // The prefill is computed when the GPU is done with it (read mode hands the blocks over at
  // once, so the last layer's copy must have landed too); the connector waits on each layer's
  // event by itself.
  if (stream_) return stream_->Sync(std::chrono::seconds(10));
  return Status::Ok();
}

void Worker::ComputeLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !compute_q_.empty(); });
      if (compute_q_.empty()) return;
      job = std::move(compute_q_.front());
      compute_q_.pop_front();
      computing_ = job.req;
      cancel_ = false;
    }
    bool cancelled = false, saved = false;
    Status s = Compute(job, &cancelled, &saved);
    if (cancelled) s = Status(Code::kAborted, "aborted by the router during its prefill");
    // "Exposed" time starts here: the last layer is computed (with --compute gpu, Compute
    // waited for the stream).
    const int64_t computed_ns = MonotonicNs();
    if (s.ok() && !cfg_.read_mode) {
      // Sealed first, told after: the report is the simulator's bookkeeping, kept off the
      // request's path (the router takes it before or after the request's end).
      s = conn_->Seal(job.req, preset_.layers);
      if (s.ok()) Report({{"t", "sealed"}, {"req", job.req}, {"ns", computed_ns}});
    } else if (s.ok()) {
      auto params = conn_->HoldForRead(job.req, job.blocks, job.tokens);
      saved = params.ok();
      s = params.status();
      if (s.ok())
        Report({{"t", "held"},
                {"req", job.req},
                {"ns", computed_ns},
                {"params", ToHex(params->Pack())}});
    }
    {
      // An abort that came after the last check above was left to this loop: the connector
      // knows the request now (sealed or held), so it ends there.
      std::lock_guard<std::mutex> lock(mu_);
      computing_.clear();
      if (cancel_ && s.ok()) s = Status(Code::kAborted, "aborted by the router");
    }
    // A request the connector knows ends through it; one it never saw ends here.
    if (!s.ok() && (!saved || !conn_->Abort(job.req).ok())) EndNow(job.req, s.ToString());
  }
}

void Worker::ReadLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !read_q_.empty(); });
      if (read_q_.empty()) return;
      job = std::move(read_q_.front());
      read_q_.pop_front();
    }
    // As attention would: each layer waits for its KV; a failure ends the request through the
    // connector, which the finisher reports.
    const auto timeout = milliseconds(cfg_.transfer_timeout_ms) + std::chrono::seconds(1);
    bool all = true;
    for (uint32_t layer = 0; layer < preset_.layers && all; ++layer)
      all = conn_->WaitLayer(job.req, layer, timeout).ok();
    if (all) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = held_.find(job.req); it != held_.end())
        it->second.last_layer_ns = MonotonicNs();
    }
  }
}

void Worker::FinishLoop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    for (kv::Finished& f : conn_->WaitFinished(milliseconds(50))) {
      // When the connector ended it (steady_clock is CLOCK_MONOTONIC, as MonotonicNs), not when
      // this thread woke: a server polls its finished requests on its own schedule.
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(f.at.time_since_epoch()).count();
      Held h;
      bool known;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = held_.find(f.request);
        known = it != held_.end();
        if (known) h = it->second;
      }
      json m = {{"t", "end"},
                {"req", f.request},
                {"outcome", OutcomeName(f.outcome)},
                {"why", f.status.ok() ? "" : f.status.ToString()},
                {"ns", h.last_layer_ns ? h.last_layer_ns : ns}};
      if (!known)
        Log("the connector ended request " + f.request + ", which this worker does not hold");
      if (known && !cfg_.prefill && f.outcome == kv::Outcome::kDone) {
        std::lock_guard<std::mutex> lock(mu_);
        check_q_.push_back({f.request, std::move(h), std::move(m)});
        cv_.notify_all();
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        held_.erase(f.request);
      }
      Report(std::move(m));
    }
  }
}

void Worker::CheckLoop() {
  for (;;) {
    Ended e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !check_q_.empty(); });
      if (check_q_.empty()) return;
      e = std::move(check_q_.front());
      check_q_.pop_front();
    }
    const Held& h = e.held;
    auto r = cache_->Check(h.n, h.blocks, h.tokens, h.first_token);
    e.report["checked"] = r.ok() ? r->bytes_checked : 0;
    e.report["bad_bytes"] = r.ok() ? r->bad_bytes : 1;
    e.report["first_bad"] = r.ok() ? r->first_bad : r.status().ToString();
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_.erase(e.req);  // its blocks are the router's again once it hears
    }
    Report(std::move(e.report));
  }
}

void Worker::Stop(milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    size_t held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held = held_.size();
    }
    if ((held == 0 && conn_->pending() == 0) || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  uint64_t held_blocks = 0;
  for (const auto& [req, h] : held_) held_blocks += h.blocks.size();
  Report({{"t", "final"},
          {"stats", StatsJson(conn_->stats())},
          {"pending", conn_->pending()},
          {"held_blocks", held_blocks}});
}

int Worker::Run() {
  if (Status s = Setup(); !s.ok()) {
    Log(s.ToString());
    Report({{"t", "error"}, {"why", s.ToString()}});
    return 1;
  }
  threads_.emplace_back([this] { FinishLoop(); });
  if (cfg_.prefill) threads_.emplace_back([this] { ComputeLoop(); });
  if (!cfg_.prefill) threads_.emplace_back([this] { CheckLoop(); });
  if (!cfg_.prefill && cfg_.read_mode) threads_.emplace_back([this] { ReadLoop(); });
  for (;;) {
    std::vector<json> lines;
    Status s = ch_.Receive(&lines, milliseconds(200));
    for (const json& m : lines)
      if (!Handle(m)) return 0;
    if (s.code() == Code::kUnavailable) {
      // The router is gone: nobody is left to report to. Leave at once; the kernel takes the
      // memory back, and peers see this engine go.
      Log("the router went away");
      _exit(1);
    }
    if (!s.ok()) Log(s.ToString());
  }
}

}  // namespace

int RunWorker(int fd) {
  if (fd < 0) return 2;
  Worker worker(fd);
  return worker.Run();
}

}  // namespace ferry::tools::pd
