#include "embed/service/server.h"

#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>
#include <cstring>

#include "base/log.h"
#include "cuda/runtime.h"
#include "embed/row_ids.h"
#include "embed/service/cuda_sink.h"
#include "embed/service/output_sink.h"
#include "embed/service/protocol.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"

namespace ferry::embed::service {
namespace {

struct Connection {
  UniqueFd fd;
  std::mutex send_mu;
  std::thread thread;
  std::atomic<bool> finished{false};

  Status Send(const std::string& bytes) {
    std::lock_guard<std::mutex> lock(send_mu);
    return service::Send(fd.get(), bytes);
  }
};

// One registered GPU worker.
struct Member {
  Register reg;
  std::vector<size_t> served;                // slot -> index into Impl::layers
  std::shared_ptr<SharedMemory> inputs;      // tensor-parallel rank 0 only
  std::unique_ptr<OutputSink> sink;
  std::shared_ptr<Connection> conn;
  std::atomic<bool> alive{true};
};

struct Step {
  Request request;
  Status error;  // set: the step fails without reading inputs (a malformed request)
};

// One data-parallel rank: its members and its queue of steps, served by `worker`.
struct Group {
  uint32_t dp_rank = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Member>> members;  // GUARDED_BY(mu), tp_size entries
  std::deque<Step> queue;                        // GUARDED_BY(mu)
  bool stopping = false;                         // GUARDED_BY(mu)
  std::thread worker;
  // Used by the worker thread only.
  std::vector<uint8_t> staging;
  bool staging_pinned = false;  // page-locked for copies to GPUs
  ~Group() {
    if (staging_pinned) (void)cuda::HostUnregister(staging.data());
  }
  std::vector<int32_t> tokens, qsl, context;
};

bool SameShape(const Register& a, const Register& b) {
  if (a.tp_size != b.tp_size || a.max_tokens != b.max_tokens || a.max_reqs != b.max_reqs ||
      a.context_len != b.context_len || a.token_bytes != b.token_bytes ||
      a.layers.size() != b.layers.size())
    return false;
  for (size_t i = 0; i < a.layers.size(); ++i)
    if (a.layers[i].layer != b.layers[i].layer) return false;
  return true;
}

std::string RankName(const Register& r) {
  return "dp " + std::to_string(r.dp_rank) + " tp " + std::to_string(r.tp_rank);
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::vector<ServedLayer> layers;
  std::unique_ptr<Gatherer> gatherer;
  UniqueFd listen_fd;
  UniqueFd wake_fd;       // ends the accept loop
  UniqueFd conn_wake_fd;  // ends the connection threads, once the groups have stopped
  std::thread accept_thread;
  std::atomic<bool> stopping{false};

  std::mutex mu;
  std::map<uint32_t, std::shared_ptr<Group>> groups;      // GUARDED_BY(mu)
  std::list<std::shared_ptr<Connection>> connections;     // GUARDED_BY(mu)
  bool stopped = false;                                   // GUARDED_BY(mu)

  std::atomic<uint64_t> registrations{0}, live{0}, steps_ok{0}, steps_failed{0};

  void AcceptLoop();
  void Serve(std::shared_ptr<Connection> conn);
  Result<std::shared_ptr<Member>> Admit(const std::shared_ptr<Connection>& conn,
                                        const Register& reg, std::vector<UniqueFd> fds);
  Status Enroll(const std::shared_ptr<Member>& m);
  void Leave(const std::shared_ptr<Member>& m);
  void Enqueue(const std::shared_ptr<Member>& m, Step step);
  void Work(std::shared_ptr<Group> g);
  Status RunStep(Group& g, const std::vector<std::shared_ptr<Member>>& members, const Step& s);
  Status RunLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                  const StepInput& in);
  Status WaitReleased(const std::vector<std::shared_ptr<Member>>& members, size_t slot,
                      Deadline deadline);
  void FailFrom(const std::vector<std::shared_ptr<Member>>& members, size_t slot);
};

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                               std::vector<ServedLayer> layers) {
  if (layers.empty()) return Status(Code::kInvalidArgument, "the service needs layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const Config& c = layers[i].layout.config();
    const Config& c0 = layers[0].layout.config();
    if (layers[i].table == nullptr) return Status(Code::kInvalidArgument, "layer without table");
    if (c.vocab_size != c0.vocab_size || c.ngram_size != c0.ngram_size ||
        c.eos_id != c0.eos_id)
      return Status(Code::kInvalidArgument, "served layers disagree on V, N or EOS");
    for (size_t j = 0; j < i; ++j)
      if (layers[j].layout.config().layer == c.layer)
        return Status(Code::kInvalidArgument,
                      "layer " + std::to_string(c.layer) + " served twice");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->layers = std::move(layers);
  FERRY_ASSIGN_OR_RETURN(impl->gatherer, Gatherer::Create(options.gather));
  FERRY_ASSIGN_OR_RETURN(impl->wake_fd, MakeWakeFd());
  FERRY_ASSIGN_OR_RETURN(impl->conn_wake_fd, MakeWakeFd());
  FERRY_ASSIGN_OR_RETURN(impl->listen_fd, Listen(options.socket_path));
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  FERRY_LOG_INFO("embed-serve: listening on {} ({} layers)", options.socket_path,
                 raw->layers.size());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }
const std::string& Server::socket_path() const { return impl_->options.socket_path; }

ServerStats Server::stats() const {
  ServerStats s;
  s.registrations = impl_->registrations.load();
  s.live_clients = impl_->live.load();
  s.steps_ok = impl_->steps_ok.load();
  s.steps_failed = impl_->steps_failed.load();
  return s;
}

void Server::Stop() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
  }
  s.stopping = true;
  SignalWakeFd(s.wake_fd.get());
  if (s.accept_thread.joinable()) s.accept_thread.join();
  std::list<std::shared_ptr<Connection>> conns;
  std::map<uint32_t, std::shared_ptr<Group>> groups;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    conns.swap(s.connections);
    groups.swap(s.groups);
  }
  // Steps in flight fail (kAborted, flags FAILED, replies sent) before connections close.
  for (auto& [dp, g] : groups) {
    {
      std::lock_guard<std::mutex> lock(g->mu);
      g->stopping = true;
    }
    g->cv.notify_all();
    if (g->worker.joinable()) g->worker.join();
  }
  SignalWakeFd(s.conn_wake_fd.get());
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
    ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  ::unlink(s.options.socket_path.c_str());
}

void Server::Impl::AcceptLoop() {
  while (!stopping) {
    Result<UniqueFd> fd = Accept(listen_fd.get(), Deadline::After(std::chrono::seconds(1)),
                                 wake_fd.get());
    if (!fd.ok()) {
      if (fd.status().code() == Code::kDeadlineExceeded) continue;
      if (fd.status().code() != Code::kCancelled)
        FERRY_LOG_WARN("embed-serve: {}", fd.status().ToString());
      if (fd.status().code() == Code::kCancelled) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    auto conn = std::make_shared<Connection>();
    conn->fd = std::move(fd).value();
    std::lock_guard<std::mutex> lock(mu);
    // Reap connections whose thread has ended.
    for (auto it = connections.begin(); it != connections.end();) {
      if ((*it)->finished) {
        (*it)->thread.join();
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
    connections.push_back(conn);
    conn->thread = std::thread([this, conn] { Serve(conn); });
  }
}

void Server::Impl::Serve(std::shared_ptr<Connection> conn) {
  std::shared_ptr<Member> member;
  for (;;) {
    Result<Message> msg =
        Receive(conn->fd.get(), Deadline::After(std::chrono::seconds(1)), conn_wake_fd.get());
    if (!msg.ok() && msg.status().code() == Code::kDeadlineExceeded) continue;
    if (!msg.ok() && msg.status().code() != Code::kInvalidArgument) break;  // closed or stop
    Result<AnyMessage> decoded =
        msg.ok() ? Decode(msg->bytes) : Result<AnyMessage>(msg.status());
    if (member == nullptr) {
      // The first message must be a registration.
      Status st = decoded.ok() ? Status::Ok() : decoded.status();
      if (st.ok() && !std::holds_alternative<Register>(*decoded))
        st = Status(Code::kFailedPrecondition, "the first message must be a registration");
      if (st.ok()) {
        Result<std::shared_ptr<Member>> m =
            Admit(conn, std::get<Register>(*decoded), std::move(msg->fds));
        if (m.ok()) member = std::move(m).value();
        st = m.ok() ? Status::Ok() : m.status();
      }
      Status sent = conn->Send(Encode(Registered{st}));
      if (!st.ok()) {
        FERRY_LOG_WARN("embed-serve: registration refused: {}", st.ToString());
        break;
      }
      if (!sent.ok()) break;
      continue;
    }
    if (decoded.ok() && std::holds_alternative<Request>(*decoded) && member->reg.tp_rank == 0) {
      const Request& req = std::get<Request>(*decoded);
      Status check;
      if (req.dp_rank != member->reg.dp_rank)
        check = Status(Code::kInvalidArgument,
                       "request for dp rank " + std::to_string(req.dp_rank) +
                           " on the connection of " + RankName(member->reg));
      Enqueue(member, Step{req, check});
      continue;
    }
    Status st = decoded.ok()
                    ? Status(Code::kFailedPrecondition,
                             "only tensor-parallel rank 0 sends step requests, once registered")
                    : decoded.status();
    FERRY_LOG_WARN("embed-serve: {}: bad message: {}", RankName(member->reg), st.ToString());
    if (member->reg.tp_rank == 0) {
      // The step it meant to start fails: its flags and its reply say so.
      Enqueue(member, Step{Request{}, st});
    } else {
      (void)conn->Send(Encode(Reply{0, st}));
    }
  }
  if (member != nullptr) Leave(member);
  conn->finished = true;
}

Result<std::shared_ptr<Member>> Server::Impl::Admit(const std::shared_ptr<Connection>& conn,
                                                    const Register& reg,
                                                    std::vector<UniqueFd> fds) {
  size_t want_fds = (reg.mode == OutputMode::kHost ? 1 : 0) + (reg.has_inputs ? 1 : 0);
  if (fds.size() != want_fds)
    return Status(Code::kInvalidArgument, "registration carries " + std::to_string(fds.size()) +
                                              " descriptors, expected " +
                                              std::to_string(want_fds));
  auto m = std::make_shared<Member>();
  m->reg = reg;
  m->conn = conn;
  for (const LayerOutput& l : reg.layers) {
    size_t found = layers.size();
    for (size_t i = 0; i < layers.size(); ++i)
      if (static_cast<uint32_t>(layers[i].layout.config().layer) == l.layer) found = i;
    if (found == layers.size())
      return Status(Code::kNotFound, "layer " + std::to_string(l.layer) + " is not served");
    const ServedLayer& s = layers[found];
    uint64_t token_bytes = static_cast<uint64_t>(s.layout.num_heads()) * s.table->row_bytes();
    if (reg.token_bytes != token_bytes)
      return Status(Code::kInvalidArgument,
                    "token_bytes " + std::to_string(reg.token_bytes) + " but layer " +
                        std::to_string(l.layer) + " has " + std::to_string(token_bytes));
    m->served.push_back(found);
  }
  uint64_t ctx = static_cast<uint64_t>(layers[0].layout.ngram_size() - 1);
  if (reg.context_len != ctx)
    return Status(Code::kInvalidArgument, "context_len " + std::to_string(reg.context_len) +
                                              ", the table's n-grams need " +
                                              std::to_string(ctx));
  const uint64_t out_bytes = reg.max_tokens * reg.token_bytes;
  size_t next_fd = 0;
  if (reg.mode == OutputMode::kHost) {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> outs,
                           SharedMemory::Map(std::move(fds[next_fd++])));
    std::shared_ptr<SharedMemory> shared = std::move(outs);
    std::vector<uint64_t> out_offsets, flag_offsets;
    for (const LayerOutput& l : reg.layers) {
      if (!shared->Contains(l.output_offset, out_bytes) || !shared->Contains(l.flag_offset, 4))
        return Status(Code::kOutOfRange, "layer " + std::to_string(l.layer) +
                                             ": output or flag outside the outputs memory of " +
                                             std::to_string(shared->bytes()) + " bytes");
      out_offsets.push_back(l.output_offset);
      flag_offsets.push_back(l.flag_offset);
    }
    m->sink = std::make_unique<HostSink>(shared, std::move(out_offsets), std::move(flag_offsets));
  } else {
    FERRY_ASSIGN_OR_RETURN(m->sink, OpenCudaSink(reg, out_bytes));
  }
  if (reg.has_inputs) {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> in,
                           SharedMemory::Map(std::move(fds[next_fd++])));
    if (!in->Contains(reg.inputs.ids, reg.max_tokens * 4) ||
        !in->Contains(reg.inputs.query_start_loc, (reg.max_reqs + 1) * 4) ||
        !in->Contains(reg.inputs.ngram_context, reg.max_reqs * reg.context_len * 4))
      return Status(Code::kOutOfRange, "inputs outside the inputs memory of " +
                                           std::to_string(in->bytes()) + " bytes");
    m->inputs = std::move(in);
  }
  FERRY_RETURN_IF_ERROR(Enroll(m));
  ++registrations;
  ++live;
  FERRY_LOG_INFO("embed-serve: registered {} ({} layers, {} tokens, {} requests)", RankName(reg),
                 reg.layers.size(), reg.max_tokens, reg.max_reqs);
  return m;
}

Status Server::Impl::Enroll(const std::shared_ptr<Member>& m) {
  std::shared_ptr<Group> g;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return Status(Code::kUnavailable, "the service is stopping");
    auto& slot = groups[m->reg.dp_rank];
    if (slot == nullptr) {
      slot = std::make_shared<Group>();
      slot->dp_rank = m->reg.dp_rank;
      start = true;
    }
    g = slot;
  }
  {
    std::lock_guard<std::mutex> lock(g->mu);
    const Member* other = nullptr;
    for (const auto& x : g->members)
      if (x != nullptr) other = x.get();
    if (other != nullptr && !SameShape(other->reg, m->reg))
      return Status(Code::kInvalidArgument,
                    RankName(m->reg) + ": tp_size, capacity or layers differ from " +
                        RankName(other->reg));
    if (other == nullptr) g->members.assign(m->reg.tp_size, nullptr);
    if (g->members[m->reg.tp_rank] != nullptr)
      return Status(Code::kAlreadyExists, RankName(m->reg) + " is already registered");
    g->members[m->reg.tp_rank] = m;
  }
  g->cv.notify_all();
  if (start) g->worker = std::thread([this, g] { Work(g); });
  return Status::Ok();
}

void Server::Impl::Leave(const std::shared_ptr<Member>& m) {
  m->alive = false;
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = groups.find(m->reg.dp_rank);
    if (it != groups.end()) g = it->second;
  }
  if (g != nullptr) {
    std::lock_guard<std::mutex> lock(g->mu);
    if (m->reg.tp_rank < g->members.size() && g->members[m->reg.tp_rank] == m)
      g->members[m->reg.tp_rank] = nullptr;
    if (m->reg.tp_rank == 0) g->queue.clear();  // nobody is left to answer
  }
  if (g != nullptr) g->cv.notify_all();
  --live;
  FERRY_LOG_INFO("embed-serve: {} left", RankName(m->reg));
}

void Server::Impl::Enqueue(const std::shared_ptr<Member>& m, Step step) {
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = groups.find(m->reg.dp_rank);
    if (it != groups.end()) g = it->second;
  }
  if (g == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    // Past twice the limit even the refusals are dropped: a flooding client cannot grow the
    // queue (its waits end by its own deadline).
    if (g->queue.size() >= 2 * options.max_queued_steps) {
      FERRY_LOG_WARN("embed-serve: dp {}: step dropped, queue full", g->dp_rank);
      return;
    }
    if (g->queue.size() >= options.max_queued_steps && step.error.ok())
      step.error = Status(Code::kResourceExhausted,
                          "more than " + std::to_string(options.max_queued_steps) +
                              " steps queued for dp rank " + std::to_string(g->dp_rank));
    g->queue.push_back(std::move(step));
  }
  g->cv.notify_all();
}

void Server::Impl::Work(std::shared_ptr<Group> g) {
  for (;;) {
    Step step;
    std::vector<std::shared_ptr<Member>> members;
    {
      std::unique_lock<std::mutex> lock(g->mu);
      g->cv.wait(lock, [&] { return g->stopping || !g->queue.empty(); });
      if (g->stopping) return;
      step = std::move(g->queue.front());
      g->queue.pop_front();
      // A step needs every rank of the group; wait for absent ones up to the deadline.
      Deadline deadline = Deadline::After(options.wait_timeout);
      auto complete = [&] {
        if (g->stopping || g->members.empty()) return true;
        for (const auto& x : g->members)
          if (x == nullptr) return false;
        return true;
      };
      if (step.error.ok()) g->cv.wait_until(lock, deadline.at(), complete);
      if (g->stopping) return;
      members = g->members;
    }
    std::shared_ptr<Member> rank0 = members.empty() ? nullptr : members[0];
    if (rank0 == nullptr) continue;  // rank 0 left: nobody asked any more
    Status st = step.error;
    if (st.ok()) {
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i] == nullptr)
          st = Status(Code::kUnavailable,
                      "tp rank " + std::to_string(i) + " of dp rank " +
                          std::to_string(g->dp_rank) + " is not registered");
    }
    std::vector<std::shared_ptr<Member>> present;
    for (auto& x : members)
      if (x != nullptr) present.push_back(x);
    if (st.ok()) {
      st = RunStep(*g, present, step);
    } else {
      FailFrom(present, 0);
    }
    (st.ok() ? steps_ok : steps_failed)++;
    if (!st.ok())
      FERRY_LOG_WARN("embed-serve: dp {} step {} failed: {}", g->dp_rank, step.request.seq,
                     st.ToString());
    if (rank0->alive) (void)rank0->conn->Send(Encode(Reply{step.request.seq, st}));
  }
}

Status Server::Impl::RunStep(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                             const Step& step) {
  const Member& r0 = *members[0];
  const Register& reg = r0.reg;
  const Request& req = step.request;
  Status st;
  if (req.num_tokens > reg.max_tokens)
    st = Status(Code::kOutOfRange, "num_tokens " + std::to_string(req.num_tokens) +
                                       " exceeds the registered " +
                                       std::to_string(reg.max_tokens));
  else if (req.num_reqs > reg.max_reqs)
    st = Status(Code::kOutOfRange, "num_reqs " + std::to_string(req.num_reqs) +
                                       " exceeds the registered " + std::to_string(reg.max_reqs));
  if (!st.ok()) {
    FailFrom(members, 0);
    return st;
  }
  // Copy the inputs out of shared memory first: what is validated is what is used, whatever
  // the client writes meanwhile.
  const uint8_t* base = r0.inputs->data();
  g.tokens.resize(req.num_tokens);
  g.qsl.resize(req.num_reqs + 1);
  g.context.resize(static_cast<size_t>(req.num_reqs) * reg.context_len);
  std::memcpy(g.tokens.data(), base + reg.inputs.ids, g.tokens.size() * 4);
  std::memcpy(g.qsl.data(), base + reg.inputs.query_start_loc, g.qsl.size() * 4);
  std::memcpy(g.context.data(), base + reg.inputs.ngram_context, g.context.size() * 4);
  StepInput in{g.tokens, g.qsl, g.context};
  st = ValidateStep(layers[r0.served[0]].layout, in);
  const size_t staging_bytes = reg.max_tokens * reg.token_bytes;
  bool want_pinned = false;
  for (const auto& m : members) want_pinned |= m->sink->wants_pinned_source();
  if (g.staging.size() != staging_bytes || (want_pinned && !g.staging_pinned)) {
    if (g.staging_pinned) (void)cuda::HostUnregister(g.staging.data());
    g.staging_pinned = false;
    g.staging.assign(staging_bytes, 0);
    if (want_pinned) {
      Status pin = cuda::HostRegister(g.staging.data(), g.staging.size());
      if (!pin.ok()) st = pin.WithContext("page-locking the staging buffer");
      g.staging_pinned = pin.ok();
    }
  }
  for (size_t slot = 0; st.ok() && slot < r0.served.size(); ++slot) {
    if (!r0.alive) return Status(Code::kAborted, "tp rank 0 left during the step");
    st = RunLayer(g, members, slot, in);
    if (!st.ok()) {
      FailFrom(members, slot);
      return st.WithContext("layer " + std::to_string(reg.layers[slot].layer));
    }
  }
  if (!st.ok()) FailFrom(members, 0);
  return st;
}

Status Server::Impl::WaitReleased(const std::vector<std::shared_ptr<Member>>& members,
                                  size_t slot, Deadline deadline) {
  for (const auto& m : members) {
    for (int spin = 0;; ++spin) {
      FERRY_ASSIGN_OR_RETURN(uint32_t v, m->sink->ReadFlag(slot));
      if (v == kFlagReset) break;
      if (stopping) return Status(Code::kAborted, "the service is stopping");
      if (!m->alive) return Status(Code::kUnavailable, RankName(m->reg) + " left");
      if (deadline.expired())
        return Status(Code::kDeadlineExceeded,
                      RankName(m->reg) + " did not release its previous output (flag " +
                          std::to_string(v) + ")");
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return Status::Ok();
}

Status Server::Impl::RunLayer(Group& g, const std::vector<std::shared_ptr<Member>>& members,
                              size_t slot, const StepInput& in) {
  const Register& reg = members[0]->reg;
  const ServedLayer& layer = layers[members[0]->served[slot]];
  FERRY_RETURN_IF_ERROR(WaitReleased(members, slot, Deadline::After(options.wait_timeout)));
  // The previous layer's copies read the staging that this layer's gather overwrites.
  for (const auto& m : members)
    FERRY_RETURN_IF_ERROR(m->sink->Drain(Deadline::After(options.wait_timeout)));
  const uint64_t tb = reg.token_bytes;
  // Rows go to the staging, or straight into the first rank's buffer when it is host memory;
  // each finished chunk is copied from there to the other ranks at once.
  uint8_t* direct = members[0]->sink->direct(slot);
  uint8_t* gathered = direct != nullptr ? direct : g.staging.data();
  std::mutex err_mu;
  Status copy_error;
  auto on_chunk = [&](int64_t begin, int64_t end) {
    const uint64_t off = static_cast<uint64_t>(begin) * tb;
    const uint64_t bytes = static_cast<uint64_t>(end - begin) * tb;
    for (size_t i = direct != nullptr ? 1 : 0; i < members.size(); ++i) {
      const auto& m = members[i];
      Status s = m->sink->Write(slot, off, gathered + off, bytes);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (copy_error.ok()) copy_error = s;
      }
    }
  };
  if (in.num_tokens() > 0) {
    std::span<uint8_t> dst(gathered, static_cast<size_t>(in.num_tokens()) * tb);
    FERRY_RETURN_IF_ERROR(
        gatherer->GatherStep(layer.layout, *layer.table, in, dst, on_chunk));
  }
  FERRY_RETURN_IF_ERROR(copy_error);
  for (const auto& m : members) FERRY_RETURN_IF_ERROR(m->sink->Finish(slot, kFlagDone));
  return Status::Ok();
}

void Server::Impl::FailFrom(const std::vector<std::shared_ptr<Member>>& members, size_t slot) {
  // Wait (briefly) for each output to be released first, so that a release still in flight
  // cannot erase the failure and leave a GPU stream waiting.
  Deadline deadline = Deadline::After(std::min<std::chrono::nanoseconds>(
      options.wait_timeout, std::chrono::seconds(2)));
  for (const auto& m : members) {
    for (size_t s = slot; s < m->sink->slots(); ++s) {
      (void)WaitReleased({m}, s, deadline);
      (void)m->sink->Signal(s, kFlagFailed);
    }
  }
}

}  // namespace ferry::embed::service
