#include "embed/service/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "embed/service/cuda_sink.h"
#include "embed/service/server_internal.h"

namespace ferry::embed::service {

using internal::Connection;
using internal::Group;
using internal::Member;
using internal::RankName;
using internal::SameShape;
using internal::Step;

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                               std::vector<ServedLayer> layers) {
  if (layers.empty()) return Status(Code::kInvalidArgument, "the service needs layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const Config& c = layers[i].layout.config();
    const Config& c0 = layers[0].layout.config();
    if (layers[i].table == nullptr) return Status(Code::kInvalidArgument, "layer without table");
    if (c.vocab_size != c0.vocab_size || c.ngram_size != c0.ngram_size || c.eos_id != c0.eos_id)
      return Status(Code::kInvalidArgument, "served layers disagree on V, N or EOS");
    for (size_t j = 0; j < i; ++j)
      if (layers[j].layout.config().layer == c.layer)
        return Status(Code::kInvalidArgument, "layer " + std::to_string(c.layer) + " served twice");
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

ServerStats Server::stats(bool reset_timings) const { return impl_->Snapshot(reset_timings); }

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
    Result<UniqueFd> fd =
        Accept(listen_fd.get(), Deadline::After(std::chrono::seconds(1)), wake_fd.get());
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
    Result<AnyMessage> decoded = msg.ok() ? Decode(msg->bytes) : Result<AnyMessage>(msg.status());
    if (member == nullptr && decoded.ok() && std::holds_alternative<StatsRequest>(*decoded)) {
      // A monitoring connection: it registers nothing and may ask again.
      Stats reply;
      reply.stats = Snapshot(std::get<StatsRequest>(*decoded).reset);
      if (!conn->Send(Encode(reply)).ok()) break;
      continue;
    }
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
        check =
            Status(Code::kInvalidArgument, "request for dp rank " + std::to_string(req.dp_rank) +
                                               " on the connection of " + RankName(member->reg));
      Enqueue(member, Step{req, check, Clock::now(), {}});
      continue;
    }
    Status st =
        !decoded.ok() ? decoded.status()
        : std::holds_alternative<Request>(*decoded)
            ? Status(Code::kFailedPrecondition, "only tensor-parallel rank 0 sends step requests")
            : Status(Code::kInvalidArgument, "unexpected message type after the registration");
    FERRY_LOG_WARN("embed-serve: {}: bad message: {}", RankName(member->reg), st.ToString());
    if (member->reg.tp_rank == 0) {
      // The step it meant to start fails: its flags and its reply say so.
      Enqueue(member, Step{Request{}, st, Clock::now(), {}});
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
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return Status(Code::kUnavailable, "the service is stopping");
    auto& slot = groups[m->reg.dp_rank];
    if (slot == nullptr) {
      slot = std::make_shared<Group>();
      slot->dp_rank = m->reg.dp_rank;
      slot->policy = std::make_unique<StepPolicy>(options.policy);
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
      return Status(
          Code::kInvalidArgument,
          RankName(m->reg) + ": tp_size, capacity or layers differ from " + RankName(other->reg));
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

}  // namespace ferry::embed::service
