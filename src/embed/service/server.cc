#include "ferry/embed_server.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "embed/checks.h"
#include "embed/service/cuda_sink.h"
#include "embed/service/server_internal.h"
#include "embed/start_thread.h"

namespace ferry::embed::service {

using internal::Connection;
using internal::Group;
using internal::Member;
using internal::RankName;
using internal::SameShape;
using internal::Step;

namespace {

// ServerOptions::pump_cpus applied to the CPUs this process may run on: both empty when
// nothing is to be pinned.
void SplitCpus(const ServerOptions& o, std::vector<int>* gather, std::vector<int>* pump) {
  std::vector<int> cpus = AllowedCpus();
  const int n = static_cast<int>(cpus.size());
  int keep = o.pump_cpus;
  if (keep < 0) keep = n > o.gather.threads ? 1 : 0;
  keep = std::min(keep, n - 1);
  if (keep <= 0) return;
  gather->assign(cpus.begin(), cpus.end() - keep);
  pump->assign(cpus.end() - keep, cpus.end());
}

// Pins the calling thread to `cpus` (when not empty) for its lifetime, then restores its mask.
class CallerAffinity {
 public:
  explicit CallerAffinity(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    saved_ = AllowedCpus();
    if (!PinThisThread(cpus)) saved_.clear();
  }
  ~CallerAffinity() {
    if (!saved_.empty()) (void)PinThisThread(saved_);
  }
  CallerAffinity(const CallerAffinity&) = delete;
  CallerAffinity& operator=(const CallerAffinity&) = delete;

 private:
  std::vector<int> saved_;
};

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                               std::vector<ServedLayer> layers) {
  FERRY_RETURN_IF_ERROR(ValidateServerOptions(options));
  if (layers.empty()) return Status(Code::kInvalidArgument, "the service needs layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const Config& c = layers[i].layout.config();
    const Config& c0 = layers[0].layout.config();
    if (layers[i].table == nullptr) return Status(Code::kInvalidArgument, "layer without table");
    if (c.vocab_size != c0.vocab_size || c.ngram_size != c0.ngram_size || c.eos_id != c0.eos_id)
      return Status(Code::kInvalidArgument, "served layers disagree on V, N or EOS");
    if (c.layer < 0 || static_cast<uint64_t>(c.layer) > kMaxLayerIndex)
      return Status(Code::kInvalidArgument, "layer " + std::to_string(c.layer) +
                                                " is outside the protocol's [0, " +
                                                std::to_string(kMaxLayerIndex) + "]");
    for (size_t j = 0; j < i; ++j)
      if (layers[j].layout.config().layer == c.layer)
        return Status(Code::kInvalidArgument, "layer " + std::to_string(c.layer) + " served twice");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->layers = std::move(layers);
  SplitCpus(options, &impl->gather_cpus, &impl->pump_cpus);
  {
    // The Gatherer's workers inherit the affinity of the thread that starts them.
    CallerAffinity pinned(impl->gather_cpus);
    FERRY_ASSIGN_OR_RETURN(impl->gatherer, Gatherer::Create(options.gather));
  }
  if (!impl->pump_cpus.empty())
    FERRY_LOG_INFO("embed-serve: copy pumps on {} CPU(s) from {}, gather threads on {} CPU(s)",
                   impl->pump_cpus.size(), impl->pump_cpus.front(), impl->gather_cpus.size());
  FERRY_ASSIGN_OR_RETURN(impl->wake_fd, MakeWakeFd());
  FERRY_ASSIGN_OR_RETURN(impl->listen_fd, Listen(options.socket_path));
  // Other users named in allowed_uids must be able to reach the socket file; everyone else who
  // connects is refused by the peer check at accept.
  if (!options.allowed_uids.empty() && ::chmod(options.socket_path.c_str(), 0666) != 0) {
    const int err = errno;
    ::unlink(options.socket_path.c_str());
    return Status(Code::kInternal, "chmod " + options.socket_path + ": " + std::strerror(err));
  }
  Impl* raw = impl.get();
  Result<std::thread> loop = StartThread("embed-serve event loop", [raw] { raw->Loop(); });
  if (!loop.ok()) {
    ::unlink(options.socket_path.c_str());
    return loop.status();
  }
  impl->loop_thread = std::move(loop).value();
  FERRY_LOG_INFO("embed-serve: listening on {} ({} layers)", options.socket_path,
                 raw->layers.size());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }
const std::string& Server::socket_path() const { return impl_->options.socket_path; }

ServerStats Server::stats(bool reset_timings) const { return impl_->Snapshot(reset_timings); }

ServerMemory Server::memory() const {
  ServerMemory m;
  m.connections = impl_->open_connections.load();
  m.groups = impl_->group_count.load();
  m.staging_bytes = impl_->staging_bytes.load();
  return m;
}

ServerStats Server::Impl::Snapshot(bool reset_timings) {
  ServerStats s;
  s.buckets = recorder.Snapshot(reset_timings);
  s.registrations = registrations.load();
  s.live_clients = live.load();
  s.steps_ok = steps_ok.load();
  s.steps_failed = steps_failed.load();
  return s;
}

void Server::Stop() {
  Impl& s = *impl_;
  {
    MutexLock lock(&s.mu);
    if (s.stopped) return;
    s.stopped = true;
  }
  s.stopping = true;
  SignalWakeFd(s.wake_fd.get());
  if (s.loop_thread.joinable()) s.loop_thread.join();
  std::map<uint32_t, std::shared_ptr<Group>> groups;
  std::vector<std::shared_ptr<Group>> retired;
  {
    MutexLock lock(&s.mu);
    groups.swap(s.groups);
    retired.swap(s.retired);
  }
  for (auto& [dp, g] : groups) retired.push_back(g);
  // Steps in flight fail (kAborted, flags FAILED, replies sent) before connections close.
  for (auto& g : retired) {
    {
      MutexLock lock(&g->mu);
      g->stopping = true;
    }
    g->cv.NotifyAll();
    if (g->worker.joinable()) g->worker.join();
  }
  s.group_count = 0;
  for (auto& c : s.connections) {
    if (c->member != nullptr) {
      c->member->alive = false;
      --s.live;
    }
    c->member = nullptr;
    c->Close();
  }
  s.connections.clear();
  s.open_connections = 0;
  ::unlink(s.options.socket_path.c_str());
}

void Server::Impl::Loop() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd.get(), POLLIN, 0});
    fds.push_back({listen_fd.get(), POLLIN, 0});
    for (const auto& c : connections) fds.push_back({c->poll_fd, POLLIN, 0});
    // The timeout only bounds how long a retired group waits to be joined.
    int n = os::Env::Current()->Poll(fds.data(), fds.size(), 200);
    if (n < 0) {
      if (errno != EINTR) {
        FERRY_LOG_WARN("embed-serve: {}", os::ErrnoStatus("poll", errno).ToString());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    if (fds[0].revents != 0) return;
    // fds[2 + i] is connections[i]: accepted connections are appended after this pass.
    size_t kept = 0;
    for (size_t i = 0; i < connections.size(); ++i) {
      std::shared_ptr<Connection> c = std::move(connections[i]);
      if (fds[2 + i].revents == 0 || OnReadable(c)) {
        connections[kept++] = std::move(c);
      } else {
        Drop(*c);
      }
    }
    connections.resize(kept);
    // A few accepts per pass: a burst of connections does not wait a pass each.
    for (int i = 0; fds[1].revents != 0 && i < 16 && AcceptOne(); ++i) {
    }
    open_connections = connections.size();
    ReapRetired();
  }
}

bool Server::Impl::AcceptOne() {
  Result<UniqueFd> fd = os::AcceptUnix(listen_fd.get());
  if (!fd.ok()) {
    if (fd.status().code() == Code::kInProgress) return false;
    // Out of descriptors (EMFILE) leaves the listener readable: do not spin on it.
    FERRY_LOG_WARN("embed-serve: {}", fd.status().ToString());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return false;
  }
  // Another user's process gets nothing: the service writes into its clients' GPU memory.
  int64_t who = -1;  // -1: unknown
  if (!os::PeerUserAllowed(fd->get(), options.allowed_uids, &who)) {
    if (refused_users.size() < 64 && refused_users.insert(who).second)  // once per user
      FERRY_LOG_WARN("embed-serve: refused a connection from another user (uid {}; --allow-uid admits one)", who);
    return true;  // closed here
  }
  if (connections.size() >= options.max_connections) {
    Status refused(Code::kResourceExhausted,
                   "the embedding service serves at most " +
                       std::to_string(options.max_connections) +
                       " connections at once; this one is refused");
    (void)os::SendMessage(fd->get(), Encode(Registered{refused}), {}, Deadline::After(Clock::duration::zero()));
    FERRY_LOG_WARN("embed-serve: {}", refused.ToString());
    return true;  // closed here
  }
  connections.push_back(std::make_shared<Connection>(std::move(fd).value()));
  return true;
}

bool Server::Impl::OnReadable(const std::shared_ptr<Connection>& conn) {
  // A few messages at most per pass, so that one busy connection cannot starve the others.
  for (int i = 0; i < 16; ++i) {
    Result<Message> msg = Receive(conn->poll_fd, Deadline::After(Clock::duration::zero()));
    if (!msg.ok() && msg.status().code() == Code::kDeadlineExceeded) return true;
    if (!msg.ok() && msg.status().code() != Code::kInvalidArgument) return false;  // closed
    if (!Handle(conn, std::move(msg))) return false;
  }
  return true;
}

void Server::Impl::Drop(Connection& conn) {
  if (conn.member != nullptr) Leave(conn.member);
  conn.member = nullptr;
  conn.Close();
}

void Server::Impl::ReapRetired() {
  std::vector<std::shared_ptr<Group>> done;
  {
    MutexLock lock(&mu);
    for (auto it = retired.begin(); it != retired.end();) {
      if ((*it)->finished) {
        done.push_back(std::move(*it));
        it = retired.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& g : done) g->worker.join();  // returned already: at once
}

bool Server::Impl::Handle(const std::shared_ptr<Connection>& conn, Result<Message> msg) {
  Result<AnyMessage> decoded = msg.ok() ? Decode(msg->bytes) : Result<AnyMessage>(msg.status());
  const std::shared_ptr<Member>& member = conn->member;
  if (member == nullptr && decoded.ok() && std::holds_alternative<StatsRequest>(*decoded)) {
    // A monitoring connection: it registers nothing and may ask again.
    Stats reply;
    reply.stats = Snapshot(std::get<StatsRequest>(*decoded).reset);
    return conn->Send(Encode(reply)).ok();
  }
  if (member == nullptr) {
    // The first message must be a registration.
    Status st = decoded.ok() ? Status::Ok() : decoded.status();
    if (st.ok() && !std::holds_alternative<Register>(*decoded))
      st = Status(Code::kFailedPrecondition, "the first message must be a registration");
    if (st.ok()) {
      Result<std::shared_ptr<Member>> m =
          Admit(conn, std::get<Register>(*decoded), std::move(msg->fds));
      if (m.ok()) conn->member = std::move(m).value();
      st = m.ok() ? Status::Ok() : m.status();
    }
    Status sent = conn->Send(Encode(Registered{st}));
    if (!st.ok()) {
      FERRY_LOG_WARN("embed-serve: registration refused: {}", st.ToString());
      return false;
    }
    return sent.ok();
  }
  if (decoded.ok() && std::holds_alternative<Request>(*decoded) && member->reg.tp_rank == 0) {
    const Request& req = std::get<Request>(*decoded);
    Status check;
    if (req.dp_rank != member->reg.dp_rank)
      check =
          Status(Code::kInvalidArgument, "request for dp rank " + std::to_string(req.dp_rank) +
                                             " on the connection of " + RankName(member->reg));
    Enqueue(member, Step{req, check, Clock::now(), {}});
    return true;
  }
  Status st =
      !decoded.ok() ? decoded.status()
      : std::holds_alternative<Request>(*decoded)
          ? Status(Code::kFailedPrecondition, "only tensor-parallel rank 0 sends step requests")
          : Status(Code::kInvalidArgument, "unexpected message type after the registration");
  FERRY_LOG_WARN("embed-serve: {}: bad message: {}", RankName(member->reg), st.ToString());
  // The step it meant to start fails under its own seq when that much of it can be read.
  Request failed;
  if (msg.ok()) failed.seq = RequestSeqOf(msg->bytes).value_or(0);
  failed.dp_rank = member->reg.dp_rank;
  if (member->reg.tp_rank == 0) {
    // Its flags and its reply say so.
    Enqueue(member, Step{failed, st, Clock::now(), {}});
    return true;
  }
  return conn->Send(Encode(Reply{failed.seq, st})).ok();
}

Result<std::shared_ptr<Member>> Server::Impl::Admit(const std::shared_ptr<Connection>& conn,
                                                    const Register& reg,
                                                    std::vector<UniqueFd> fds) {
  size_t want_fds = (reg.mode == OutputMode::kHost ? 1 : 0) + (reg.has_inputs ? 1 : 0);
  if (fds.size() != want_fds)
    return Status(Code::kInvalidArgument, "registration carries " + std::to_string(fds.size()) +
                                              " descriptors, expected " + std::to_string(want_fds));
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
      return Status(Code::kInvalidArgument, "token_bytes " + std::to_string(reg.token_bytes) +
                                                " but layer " + std::to_string(l.layer) + " has " +
                                                std::to_string(token_bytes));
    m->served.push_back(found);
  }
  uint64_t ctx = static_cast<uint64_t>(layers[0].layout.ngram_size() - 1);
  if (reg.context_len != ctx)
    return Status(Code::kInvalidArgument, "context_len " + std::to_string(reg.context_len) +
                                              ", the table's n-grams need " + std::to_string(ctx));
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
  {
    MutexLock lock(&mu);
    if (stopped) return Status(Code::kUnavailable, "the service is stopping");
    auto it = groups.find(m->reg.dp_rank);
    if (it != groups.end()) {
      g = it->second;
    } else {
      auto fresh = std::make_shared<Group>(&staging_bytes);
      fresh->dp_rank = m->reg.dp_rank;
      fresh->policy = std::make_unique<StepPolicy>(options.policy);
      FERRY_ASSIGN_OR_RETURN(
          fresh->worker,
          StartThread("embed-serve group", [this, raw = fresh.get()] { Work(*raw); }));
      g = groups[m->reg.dp_rank] = std::move(fresh);
      ++group_count;
    }
    // Under mu too: Leave retires a group whose last member left under both locks.
    MutexLock glock(&g->mu);
    const Member* other = nullptr;
    for (const auto& x : g->members)
      if (x != nullptr) other = x.get();
    if (other != nullptr && !SameShape(other->reg, m->reg))
      return Status(
          Code::kInvalidArgument,
          RankName(m->reg) + ": tp_size, capacity or layers differ from " + RankName(other->reg));
    if (other == nullptr) g->members.assign(m->reg.tp_size, nullptr);
    if (g->members[m->reg.tp_rank] != nullptr)
      return Status(Code::kAlreadyExists, RankName(m->reg) + " is already registered");
    g->members[m->reg.tp_rank] = m;
  }
  g->cv.NotifyAll();
  return Status::Ok();
}

void Server::Impl::Leave(const std::shared_ptr<Member>& m) {
  m->alive = false;
  std::shared_ptr<Group> g;
  {
    MutexLock lock(&mu);
    auto it = groups.find(m->reg.dp_rank);
    if (it != groups.end()) {
      g = it->second;
      MutexLock glock(&g->mu);
      if (m->reg.tp_rank < g->members.size() && g->members[m->reg.tp_rank] == m)
        g->members[m->reg.tp_rank] = nullptr;
      if (m->reg.tp_rank == 0) g->queue.clear();  // nobody is left to answer
      bool empty = true;
      for (const auto& x : g->members) empty &= x == nullptr;
      if (empty) {
        // The last rank left: the group, its thread and its staging go (joined by the loop).
        g->stopping = true;
        retired.push_back(g);
        groups.erase(it);
        --group_count;
      }
    }
  }
  if (g != nullptr) g->cv.NotifyAll();
  --live;
  FERRY_LOG_INFO("embed-serve: {} left", RankName(m->reg));
}

void Server::Impl::Enqueue(const std::shared_ptr<Member>& m, Step step) {
  std::shared_ptr<Group> g;
  {
    MutexLock lock(&mu);
    auto it = groups.find(m->reg.dp_rank);
    if (it != groups.end()) g = it->second;
  }
  if (g == nullptr) return;
  {
    MutexLock lock(&g->mu);
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
  g->cv.NotifyAll();
}

}  // namespace ferry::embed::service
