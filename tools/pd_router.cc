#include "pd_router.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>

#include <map>

#include "pd_channel.h"
#include "pd_procs.h"
#include "pd_router_state.h"
#include "pd_summary.h"

namespace ferry::tools::pd {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

class Router {
 public:
  explicit Router(const PdConfig& c) : c_(c) {}
  int Run();

 private:
  Status Start();
  Status WaitFor(bool WorkerState::*flag, std::string_view what, milliseconds timeout);
  void Poll(milliseconds timeout);
  void OnMessage(size_t w, const json& m);
  void OnEnd(RequestState& r, size_t w, const json& m);
  void OnDeath(size_t w);
  void Dispatch(Clock::time_point now);
  void TellDecode(RequestState& r);
  void Abort(RequestState& r, std::string_view why);
  void MaybeFinish(RequestState& r);
  void CheckDeadlines(Clock::time_point now);
  void Send(size_t w, const json& m);
  void Kill(bool prefill);
  void StopPrefill();
  void Stop();
  void PrintProgress(Clock::time_point now);
  int Finish();
  RequestState* Find(const json& m);

  const PdConfig& c_;
  std::vector<WorkerState> workers_;
  std::vector<InstanceState> instances_;
  std::vector<RequestState> requests_;
  std::map<std::string, size_t> by_id_;
  std::vector<size_t> queue_;  // arrived, waiting for blocks
  size_t arrived_ = 0, running_ = 0, ended_ = 0, done_ = 0, failed_ = 0;
  size_t rr_p_ = 0, rr_d_ = 0;
  std::string killed_;  // the workers killed, ", " between them
  bool killed_prefill_ = false, killed_decode_ = false, stopped_prefill_ = false;
  Stopper stopper_;
  std::string setup_error_;
  Clock::time_point t0_, last_end_, last_progress_;
  uint64_t bytes_done_ = 0;
  std::vector<RequestRecord> records_;
};

Status Router::Start() {
  for (bool prefill : {true, false}) {
    const SideConfig& side = prefill ? c_.prefill : c_.decode;
    for (uint32_t i = 0; i < side.instances * side.dp; ++i) {
      InstanceState inst;
      inst.prefill = prefill;
      inst.name = InstanceName(prefill, i / side.dp);
      inst.dp = i % side.dp;
      inst.block_tokens = side.block_tokens;
      inst.blocks = BlockAllocator(side.blocks);
      for (uint32_t r = 0; r < side.tp; ++r) {
        WorkerState w;
        w.cfg = MakeWorkerConfig(c_, prefill, i / side.dp, inst.dp, r);
        w.id = fmt::format("{}/dp{}/tp{}", inst.name, inst.dp, r);
        w.instance = instances_.size();
        w.rec.id = w.id;
        w.rec.prefill = prefill;
        FERRY_ASSIGN_OR_RETURN(w.proc, SpawnWorker());
        inst.workers.push_back(workers_.size());
        workers_.push_back(std::move(w));
        Send(workers_.size() - 1,
             {{"t", "config"}, {"config", json::parse(workers_.back().cfg.ToJson())}});
      }
      instances_.push_back(std::move(inst));
    }
  }
  FERRY_RETURN_IF_ERROR(WaitFor(&WorkerState::ready, "start", std::chrono::seconds(60)));
  // Every worker learns every worker of the other role (every TP rank of a producer must be
  // known before a consumer expects its writes).
  for (size_t w = 0; w < workers_.size(); ++w) {
    json addrs = json::array();
    for (const WorkerState& o : workers_)
      if (o.cfg.prefill != workers_[w].cfg.prefill) addrs.push_back(o.addr);
    Send(w, {{"t", "peers"}, {"addrs", addrs}});
  }
  return WaitFor(&WorkerState::peered, "meet its peers", std::chrono::seconds(30));
}

Status Router::WaitFor(bool WorkerState::*flag, std::string_view what, milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (!setup_error_.empty()) return Status(Code::kUnavailable, setup_error_);
    size_t missing = 0;
    for (const WorkerState& w : workers_) {
      if (!w.alive)
        return Status(Code::kUnavailable,
                      fmt::format("worker {} died before it could {}", w.id, what));
      missing += w.*flag ? 0 : 1;
    }
    if (missing == 0) return Status::Ok();
    if (Clock::now() >= until)
      return Status(Code::kDeadlineExceeded,
                    fmt::format("{} workers did not {} within {} s", missing, what,
                                std::chrono::duration<double>(timeout).count()));
    Poll(milliseconds(50));
  }
}

void Router::Send(size_t w, const json& m) {
  if (!workers_[w].alive) return;
  // A dead worker shows as its channel closing, which Poll handles.
  if (Status s = workers_[w].proc.channel->Send(m); !s.ok() && s.code() != Code::kUnavailable)
    fmt::print(stderr, "ferry pd: to worker {}: {}\n", workers_[w].id, s.ToString());
}

void Router::Poll(milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<size_t> who;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!workers_[w].alive) continue;
    fds.push_back({workers_[w].proc.channel->fd(), POLLIN, 0});
    who.push_back(w);
  }
  if (fds.empty()) return;
  if (poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    std::vector<json> lines;
    Status s = workers_[who[i]].proc.channel->ReadAvailable(&lines);
    for (const json& m : lines) OnMessage(who[i], m);
    if (s.code() == Code::kUnavailable) {
      OnDeath(who[i]);
    } else if (!s.ok()) {
      fmt::print(stderr, "ferry pd: from worker {}: {}\n", workers_[who[i]].id, s.ToString());
    }
  }
}

RequestState* Router::Find(const json& m) {
  std::string id;
  if (!GetString(m, "req", &id, 64)) return nullptr;
  auto it = by_id_.find(id);
  return it == by_id_.end() || !requests_[it->second].running ? nullptr : &requests_[it->second];
}

void Router::OnMessage(size_t w, const json& m) {
  WorkerState& wk = workers_[w];
  const std::string t = TypeOf(m);
  if (t == "ready") {
    wk.ready = GetString(m, "addr", &wk.addr, 256);
  } else if (t == "peered") {
    wk.peered = true;
  } else if (t == "error") {
    std::string why = m.value("why", std::string("?"));
    fmt::print(stderr, "ferry pd: worker {}: {}\n", wk.id, why);
    if (!wk.peered) setup_error_ = fmt::format("worker {}: {}", wk.id, why);
  } else if (t == "final") {
    wk.final = true;
    (void)GetU64(m, "pending", &wk.rec.pending);
    (void)GetU64(m, "held_blocks", &wk.rec.held_blocks);
    if (m.contains("stats") && m["stats"].is_object()) wk.rec.stats = m["stats"];
  } else if (t == "sealed") {
    // Told after Seal(): the rank's end may have come first.
    RequestState* r = Find(m);
    int64_t ns = 0;
    if (r == nullptr || !GetI64(m, "ns", &ns)) return;
    r->computed_ns = std::max(r->computed_ns, ns);
    if (r->p_left.count(w)) r->computed.insert(w);
  } else if (t == "held") {
    RequestState* r = Find(m);
    int64_t ns = 0;
    if (r == nullptr || !r->p_left.count(w) || !GetI64(m, "ns", &ns)) return;
    r->computed.insert(w);
    r->computed_ns = std::max(r->computed_ns, ns);
    if (r->params.empty()) (void)GetString(m, "params", &r->params);
    TellDecode(*r);
  } else if (t == "end") {
    if (RequestState* r = Find(m)) OnEnd(*r, w, m);
  }
}

// Read mode: once every live prefill rank holds the request, the decode ranks read it.
void Router::TellDecode(RequestState& r) {
  if (c_.mode != Mode::kRead || r.d_told || r.failed || r.params.empty()) return;
  for (size_t w : r.p_left)
    if (!r.computed.count(w)) return;
  r.d_told = true;
  for (size_t w : instances_[r.d].workers)
    Send(w, {{"t", "read"},
             {"req", r.id},
             {"n", r.n},
             {"tokens", r.tokens},
             {"first_token", r.first_token},
             {"blocks", r.d_blocks},
             {"params", r.params}});
}

void Router::OnEnd(RequestState& r, size_t w, const json& m) {
  const bool decode = r.d_left.count(w) != 0;
  if (!decode && !r.p_left.count(w)) return;
  std::string outcome, why;
  (void)GetString(m, "outcome", &outcome, 32);
  (void)GetString(m, "why", &why, 4096);
  if (decode) {
    r.d_left.erase(w);
    int64_t ns = 0;
    if (GetI64(m, "ns", &ns)) r.d_end_ns = std::max(r.d_end_ns, ns);
    uint64_t bad = 0;
    if (GetU64(m, "bad_bytes", &bad) && bad != 0) {
      r.bad_bytes += bad;
      fmt::print(stderr, "ferry pd: {} on {}: {} bytes did not verify; first: {}\n", r.id,
                 workers_[w].id, bad, m.value("first_bad", std::string()));
    }
    if (outcome != "done" && !r.failed) {
      r.failed = true;
      r.why = fmt::format("{} on {}: {}", outcome, workers_[w].id, why);
    }
  } else {
    r.p_left.erase(w);
    if (outcome != "done" && !r.failed) {
      r.failed = true;
      r.why = fmt::format("{} on {}: {}", outcome, workers_[w].id, why);
    }
    // Read mode: a prefill rank that failed before the decode side heard of the request leaves
    // the decode side nothing to do, and the other prefill ranks must let go of it.
    if (c_.mode == Mode::kRead && !r.d_told && r.failed) Abort(r, r.why);
  }
  MaybeFinish(r);
}

void Router::Abort(RequestState& r, std::string_view why) {
  if (!r.failed) {
    r.failed = true;
    r.why = std::string(why);
  }
  if (c_.mode == Mode::kRead && !r.d_told) r.d_left.clear();  // the decode side never heard of it
  for (const auto* left : {&r.p_left, &r.d_left})
    for (size_t w : *left) Send(w, {{"t", "abort"}, {"req", r.id}});
}

void Router::OnDeath(size_t w) {
  WorkerState& wk = workers_[w];
  if (!wk.alive) return;
  wk.alive = false;
  if (wk.final) {  // it reported and left, as asked
    if (Exited(wk.proc.pid)) wk.proc.pid = -1;
    return;
  }
  wk.rec.alive = false;
  if (Exited(wk.proc.pid)) wk.proc.pid = -1;
  instances_[wk.instance].broken = true;
  if (!wk.rec.killed) fmt::print(stderr, "ferry pd: worker {} died\n", wk.id);
  for (RequestState& r : requests_) {
    if (!r.running || (!r.p_left.count(w) && !r.d_left.count(w))) continue;
    const bool prefill = r.p_left.erase(w) != 0;
    const bool decode = r.d_left.erase(w) != 0;
    // Write mode: the connector of the other side finds the peer gone and ends the request.
    if (prefill && c_.mode == Mode::kRead && !r.d_told)
      Abort(r, "prefill worker " + wk.id + " died");
    // A decode rank gone: the request cannot be done, so the ranks still in it let go now
    // (their connectors settle with the dead peer), rather than compute and hold for nobody.
    if (decode) Abort(r, "decode worker " + wk.id + " died");
    MaybeFinish(r);
  }
}

void Router::Dispatch(Clock::time_point now) {
  while (!queue_.empty()) {
    RequestState& r = requests_[queue_.front()];
    auto pick = [&](bool prefill, size_t* rr) -> std::optional<size_t> {
      std::vector<size_t> live;
      for (size_t i = 0; i < instances_.size(); ++i)
        if (instances_[i].prefill == prefill && !instances_[i].broken) live.push_back(i);
      if (live.empty()) return std::nullopt;
      return live[*rr % live.size()];
    };
    auto p = pick(true, &rr_p_), d = pick(false, &rr_d_);
    if (!p || !d) {  // nothing can serve it: it fails at once
      queue_.erase(queue_.begin());
      r.running = true;
      r.failed = true;
      r.why = p ? "no decode instance is alive" : "no prefill instance is alive";
      MaybeFinish(r);
      continue;
    }
    InstanceState& pi = instances_[*p];
    InstanceState& di = instances_[*d];
    // Prefill computes the whole prompt; decode holds the prefix hit already and takes the rest.
    const uint64_t hit = c_.PrefixHitTokens(r.tokens);
    auto pb = pi.blocks.Allocate((r.tokens + pi.block_tokens - 1) / pi.block_tokens);
    if (!pb) return;  // wait for blocks, first come first served
    auto db = di.blocks.Allocate((r.tokens - hit + di.block_tokens - 1) / di.block_tokens);
    if (!db) {
      (void)pi.blocks.Free(*pb);
      return;
    }
    queue_.erase(queue_.begin());
    ++rr_p_, ++rr_d_, ++running_;
    r.running = true;
    r.dispatched = true;
    r.p = *p, r.d = *d;
    r.first_token = hit;
    r.p_blocks = std::move(*pb);
    r.d_blocks = std::move(*db);
    for (size_t w : pi.workers)
      if (workers_[w].alive) r.p_left.insert(w);
    for (size_t w : di.workers)
      if (workers_[w].alive) r.d_left.insert(w);
    // A prefill instance computes one request at a time: this one waits for those before it.
    size_t ahead = 0;
    for (const RequestState& o : requests_)
      ahead += o.running && o.p == r.p && !o.p_left.empty() ? 1 : 0;
    r.deadline = now + 2 * c_.transfer_timeout + std::chrono::seconds(5) +
                 ahead * c_.preset.layers * (c_.layer_time + milliseconds(2));
    if (c_.mode == Mode::kWrite)  // as vLLM's write mode: both sides hear of it at once
      for (size_t w : di.workers)
        Send(w, {{"t", "expect"},
                 {"req", r.id},
                 {"n", r.n},
                 {"tokens", r.tokens},
                 {"first_token", r.first_token},
                 {"producer", pi.name},
                 {"producer_dp", pi.dp},
                 {"blocks", r.d_blocks}});
    for (size_t w : pi.workers)
      Send(w, {{"t", "prefill"},
               {"req", r.id},
               {"n", r.n},
               {"tokens", r.tokens},
               {"blocks", r.p_blocks}});
  }
}

void Router::MaybeFinish(RequestState& r) {
  if (!r.running || !r.p_left.empty() || !r.d_left.empty()) return;
  r.running = false;
  if (r.dispatched) --running_;
  // Every rank of both instances let go: the blocks are the schedulers' again (a broken
  // instance is not counted, and a request the router had to abort keeps them: leaked).
  if (r.dispatched && !r.aborted) {
    for (auto [inst, blocks] : {std::pair{r.p, &r.p_blocks}, std::pair{r.d, &r.d_blocks}})
      if (!instances_[inst].broken && !blocks->empty())
        if (Status s = instances_[inst].blocks.Free(*blocks); !s.ok())
          fmt::print(stderr, "ferry pd: {}: {}\n", r.id, s.ToString());
  }
  RequestRecord rec;
  rec.id = r.n;
  rec.tokens = r.tokens;
  rec.end = r.aborted ? RequestEnd::kStuck : (r.failed ? RequestEnd::kFailed : RequestEnd::kDone);
  rec.why = r.why;
  rec.bad_bytes = r.bad_bytes;
  if (rec.end == RequestEnd::kDone) {
    if (r.computed_ns && r.d_end_ns)
      rec.exposed_us = std::max<double>(0, (r.d_end_ns - r.computed_ns) / 1e3);
    for (size_t w : instances_[r.d].workers) {
      const HeadSlice h =
          HeadsOf(c_.preset.kv_heads, c_.preset.mla, c_.decode.tp, workers_[w].cfg.tp_rank);
      rec.bytes += (r.tokens - r.first_token) * TokenBytes(c_.preset, h.count);
    }
    bytes_done_ += rec.bytes;
    ++done_;
  } else {
    ++failed_;
    if (!r.why.empty() && !c_.fault_run())
      fmt::print(stderr, "ferry pd: {} failed: {}\n", r.id, r.why);
  }
  records_.push_back(rec);
  ++ended_;
  last_end_ = Clock::now();
  if (c_.kill_prefill_after != 0 && !killed_prefill_ && ended_ >= c_.kill_prefill_after)
    Kill(/*prefill=*/true);
  if (c_.kill_decode_after != 0 && !killed_decode_ && ended_ >= c_.kill_decode_after)
    Kill(/*prefill=*/false);
  if (c_.stop_prefill_after != 0 && !stopped_prefill_ && ended_ >= c_.stop_prefill_after)
    StopPrefill();
}

void Router::CheckDeadlines(Clock::time_point now) {
  for (RequestState& r : requests_) {
    if (!r.running || now < r.deadline) continue;
    if (r.dispatched && !r.aborted) {  // stuck: ask every rank still in it to let go
      fmt::print(stderr, "ferry pd: {} is stuck (ranks left: {} prefill, {} decode); aborting it\n",
                 r.id, r.p_left.size(), r.d_left.size());
      r.aborted = true;
      Abort(r, "stuck");
      r.deadline = now + c_.transfer_timeout + std::chrono::seconds(5);
      MaybeFinish(r);
    } else {  // not even the abort ended it: give up on it
      r.p_left.clear();
      r.d_left.clear();
      MaybeFinish(r);
    }
  }
}

// --kill-prefill-after, --kill-decode-after: SIGKILL a worker of that role (ChooseVictim).
void Router::Kill(bool prefill) {
  (prefill ? killed_prefill_ : killed_decode_) = true;
  const size_t victim = ChooseVictim(requests_, workers_, prefill);
  if (victim == SIZE_MAX) return;
  WorkerState& wk = workers_[victim];
  killed_ += (killed_.empty() ? "" : ", ") + wk.id;
  wk.rec.killed = true;
  instances_[wk.instance].broken = true;  // no new requests go there
  fmt::print(stderr, "ferry pd: killing {} worker {} (pid {}) after {} requests\n",
             prefill ? "prefill" : "decode", wk.id, wk.proc.pid, ended_);
  (void)kill(wk.proc.pid, SIGKILL);
}

// --stop-prefill-after: SIGSTOP a prefill worker (ChooseVictim) for --stop-ms; it stays in the
// run (the router cannot tell a stopped worker from a slow one).
void Router::StopPrefill() {
  stopped_prefill_ = true;
  const size_t victim = ChooseVictim(requests_, workers_, /*prefill=*/true);
  if (victim == SIZE_MAX) return;
  killed_ += (killed_.empty() ? "" : ", ") + workers_[victim].id + " (stopped)";
  fmt::print(stderr, "ferry pd: stopping prefill worker {} (pid {}) after {} requests\n",
             workers_[victim].id, workers_[victim].proc.pid, ended_);
  stopper_.Stop(workers_[victim].proc.pid, c_.stop_time);
}

void Router::PrintProgress(Clock::time_point now) {
  if (now - last_progress_ < std::chrono::seconds(1)) return;
  last_progress_ = now;
  const double s = std::chrono::duration<double>(now - t0_).count();
  fmt::print(stderr,
             "ferry pd: {:.0f} s: {}/{} arrived, {} done, {} failed, {} in flight, {} waiting, "
             "{:.2f} GB/s\n",
             s, arrived_, requests_.size(), done_, failed_, running_, queue_.size(),
             s > 0 ? static_cast<double>(bytes_done_) / s / 1e9 : 0.0);
}

// Asks every live worker to drain and report; waits for the reports, then for the exits.
void Router::Stop() {
  const milliseconds drain =
      std::chrono::duration_cast<milliseconds>(2 * c_.transfer_timeout) + milliseconds(2000);
  for (size_t w = 0; w < workers_.size(); ++w) Send(w, {{"t", "stop"}, {"wait_ms", drain.count()}});
  const auto until = Clock::now() + drain + std::chrono::seconds(10);
  for (;;) {
    bool all = true;
    for (const WorkerState& w : workers_) all = all && (!w.alive || w.final);
    if (all || Clock::now() >= until) break;
    Poll(milliseconds(50));
  }
  for (WorkerState& w : workers_) {
    if (w.alive && !w.final) {
      w.rec.alive = false;
      fmt::print(stderr, "ferry pd: worker {} did not report at the end\n", w.id);
    }
    if (w.proc.pid > 0) Reap(w.proc.pid, milliseconds(10000));
    w.proc.pid = -1;
  }
}

int Router::Run() {
  requests_.resize(c_.arrivals.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    requests_[i].n = i;
    requests_[i].id = fmt::format("r{}", i);
    requests_[i].tokens = c_.arrivals[i].tokens;
    by_id_[requests_[i].id] = i;
  }
  if (Status s = Start(); !s.ok()) {
    fmt::print(stderr, "ferry pd: {}\n", s.ToString());
    Stop();
    return 1;
  }
  t0_ = last_end_ = last_progress_ = Clock::now();
  const auto until = t0_ + c_.timeout;
  while (ended_ < requests_.size()) {
    const auto now = Clock::now();
    if (now >= until) {
      fmt::print(stderr, "ferry pd: --timeout passed with {} requests not ended\n",
                 requests_.size() - ended_);
      break;
    }
    const double elapsed = std::chrono::duration<double>(now - t0_).count();
    while (arrived_ < requests_.size() && c_.arrivals[arrived_].at_s <= elapsed)
      queue_.push_back(arrived_++);
    Dispatch(now);
    CheckDeadlines(now);
    stopper_.Tick();
    PrintProgress(now);
    milliseconds wait(20);
    if (arrived_ < requests_.size()) {
      const double next = c_.arrivals[arrived_].at_s - elapsed;
      wait = std::min(wait, milliseconds(static_cast<int64_t>(std::max(0.0, next) * 1e3)));
    }
    Poll(wait);
  }
  return Finish();
}

int Router::Finish() {
  for (RequestState& r : requests_) {
    if (r.running || std::find(queue_.begin(), queue_.end(), r.n) != queue_.end() ||
        r.n >= arrived_) {
      RequestRecord rec{
          r.n, r.tokens, RequestEnd::kStuck, -1, 0, 0, "did not end before --timeout"};
      records_.push_back(rec);
    }
  }
  const double seconds = std::chrono::duration<double>(last_end_ - t0_).count();
  stopper_.Tick(/*run_ends=*/true);
  Stop();
  RunFacts facts;
  facts.model = c_.preset.name;
  facts.mode = c_.mode == Mode::kWrite ? "write" : "read";
  facts.transport = c_.transport;
  facts.memory = c_.memory == MemoryPlace::kHost ? "host" : "gpu";
  facts.shape = Shape(c_);
  facts.seconds = seconds;
  facts.layers = c_.preset.layers;
  facts.fault_run = c_.fault_run();
  facts.killed = killed_;
  for (const InstanceState& inst : instances_)
    if (!inst.broken) facts.blocks_leaked += inst.blocks.allocated();
  std::vector<WorkerRecord> workers;
  for (const WorkerState& w : workers_) workers.push_back(w.rec);
  const Summary s = Summarize(records_, workers, facts);
  if (c_.json) {
    fmt::print("{}\n", ToJson(s, workers, facts).dump());
  } else {
    PrintText(stdout, s, workers, facts);
  }
  std::fflush(stdout);
  return s.ok ? 0 : 1;
}

}  // namespace

int RunRouter(const PdConfig& config) {
  Router router(config);
  return router.Run();
}

}  // namespace ferry::tools::pd
