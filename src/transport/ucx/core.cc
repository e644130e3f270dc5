#include "transport/ucx/core.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "base/log.h"
#include "base/tsan.h"
#include "transport/ucx/listen_socket.h"

namespace ferry::internal::ucx {
namespace {

// A heap-held send: the header and payload stay valid until UCX completes the send.
struct SendCtx {
  uint8_t header[kAmHeaderBytes];
  std::string payload;
  std::shared_ptr<void> hold;  // source region of a read response, or a bounce buffer
  uint64_t* in_flight = nullptr;    // Shard::sends_in_flight
};

void OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendCtx*>(user_data);
  --*ctx->in_flight;
  delete ctx;
  ucp_request_free(request);
}

std::string ReadUcxTls() {
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return "";
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  std::string tls;
  if (f != nullptr) {
    ucp_config_print(config, f, nullptr, UCS_CONFIG_PRINT_CONFIG);
    fclose(f);
    std::string text(buf, len);
    free(buf);
    size_t at = text.find("\nUCX_TLS=");
    if (at == std::string::npos && text.rfind("UCX_TLS=", 0) == 0) at = 0;
    else if (at != std::string::npos) at += 1;
    if (at != std::string::npos) {
      size_t start = at + strlen("UCX_TLS=");
      tls = text.substr(start, text.find('\n', start) - start);
    }
  }
  ucp_config_release(config);
  return tls;
}

}  // namespace

Result<std::shared_ptr<Core>> Core::Create(const TransportContext& ctx, std::unique_ptr<StageCopier> copier) {
  const UcxOptions& o = ctx.options->ucx;
  if (o.lanes < 1 || o.lanes > 64) return Status(Code::kInvalidArgument, "ucx.lanes must be in 1..64");
  if (o.workers < 1 || o.workers > 16) return Status(Code::kInvalidArgument, "ucx.workers must be in 1..16");
  if (o.post_batch < 1) return Status(Code::kInvalidArgument, "ucx.post_batch must be positive");
  if (o.max_am_bytes < 4096) return Status(Code::kInvalidArgument, "ucx.max_am_bytes must be >= 4096");
  std::shared_ptr<Core> core(new Core());
  core->engine_key_ = ctx.engine_key;
  core->options_ = o;
  core->inbox_ = ctx.inbox;

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucs_status_t st = ucp_init(&params, nullptr, &core->context_);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");

  core->rma_ = DecideRma(AvailableUctTransports(), ReadUcxTls());
  for (int i = 0; i < o.workers; ++i) {
    auto shard = std::make_unique<Shard>();
    shard->core = core.get();
    shard->index = static_cast<size_t>(i);
    FERRY_ASSIGN_OR_RETURN(shard->worker, Worker::Create(core->context_, o.progress));
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = kAmId;
    am.cb = &Core::OnMessage;
    am.arg = shard.get();
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(shard->worker->handle(), &am);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
    core->shards_.push_back(std::move(shard));
  }
  FERRY_RETURN_IF_ERROR(core->Listen());
  core->stager_ = std::make_unique<Stager>(core.get(), std::move(copier));

  for (auto& shard : core->shards_) {
    Shard* raw = shard.get();
    raw->worker->Start([raw] { Forget(*raw); },
                       [raw] { return !raw->pending.empty() || raw->sends_in_flight > 0; });
  }
  return core;
}

// Forgets operations whose transfer already ended (deadline, failure), completing their part so
// the transfer lets go of its regions: a late answer for them is dropped, and a message still
// being sent holds its own region (see Send).
void Core::Forget(Shard& s) {
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    if (!it->second.state->finished()) {
      ++it;
      continue;
    }
    auto state = std::move(it->second.state);
    it = s.pending.erase(it);
    state->PartDone(Status(Code::kDeadlineExceeded, "no answer before the deadline"));
  }
}

Status Core::Listen() {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options_.listen_port);
  if (inet_pton(AF_INET, options_.listen_host.c_str(), &addr.sin_addr) != 1)
    return Status(Code::kInvalidArgument, "ucx.listen_host '" + options_.listen_host + "' is not an IPv4 address");
  ucp_listener_params_t params = {};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = sizeof(addr);
  params.conn_handler.cb = &Core::OnConnRequest;
  params.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(shards_[0]->worker->handle(), &params, &listener_);
  if (st != UCS_OK)
    return FromUcs(st, "listening on " + options_.listen_host + ":" + std::to_string(options_.listen_port));
  ucp_listener_attr_t attr = {};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) return FromUcs(st, "ucp_listener_query");
  uint16_t port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  listen_port_ = port;

  if (options_.listen_host != "0.0.0.0") {
    addresses_.push_back(options_.listen_host + ":" + std::to_string(port));
    return Status::Ok();
  }
  // Every interface: advertise each IPv4 address, loopback first (peers on this host use it).
  addresses_.push_back("127.0.0.1:" + std::to_string(port));
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
      std::string ip(buf);
      if (ip.rfind("127.", 0) == 0) continue;
      addresses_.push_back(ip + ":" + std::to_string(port));
    }
    freeifaddrs(ifs);
  }
  return Status::Ok();
}

Core::~Core() {
  Shutdown();
  stager_.reset();  // waits for its GPU copies; needs the (stopped) worker
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (auto& [id, r] : regions_)
    if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
  regions_.clear();
  CloseListener();
  shards_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
}

// UCX (1.13 here) hands a connection request whose TCP connection it accepted before the
// listener was destroyed, but whose request data arrives after, to the destroyed listener: a
// peer that connected while an engine shut down crashed the process (shutdown_test.cc). So the
// listening socket first stops taking connections (Shutdown), the requests of connections it
// already took are received and rejected while shard 0's worker still runs, and the listener is
// destroyed only then, right before the workers, with nothing progressing them any more.
void Core::CloseListener() {
  if (listener_ == nullptr) return;
  using Clock = std::chrono::steady_clock;
  ucp_worker_h worker = shards_[0]->worker->handle();  // stopped: this thread is its only user
  // Until every connection the listener took is closed, but for the refused requests held in
  // refused_: the requests still to come are received (and held), the endpoints Shutdown closed
  // finish closing. Then the held requests are rejected, just before the listener goes. A peer that
  // connected but sends nothing is waited for at most kLinger.
  constexpr auto kLinger = std::chrono::milliseconds(200);
  const auto start = Clock::now();
  auto checked = start;
  for (auto now = start; now - start < kLinger; now = Clock::now()) {
    if (ucp_worker_progress(worker) != 0) continue;
    if (now - checked >= std::chrono::milliseconds(1) || now == start) {
      checked = now;
      if (CountAcceptedConnections(listen_port_) <= static_cast<int>(refused_.size()) &&
          now - std::max(start, last_conn_request_) >= std::chrono::milliseconds(1))
        break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (ucp_conn_request_h r : refused_) ucp_listener_reject(listener_, r);
  refused_.clear();
  ucp_listener_destroy(listener_);
  listener_ = nullptr;
}

void Core::Shutdown() {
  if (shut_down_ || shards_.empty()) return;
  shut_down_ = true;
  if (listener_ != nullptr) {
    Status s = RefuseNewConnections(listen_port_);
    if (!s.ok()) FERRY_LOG_DEBUG("ucx: {}", s.ToString());
  }
  // Shard 0 last: it holds the listener and the endpoints that peers opened.
  for (size_t i = shards_.size(); i-- > 0;) {
    Shard* s = shards_[i].get();
    s->worker->Stop([this, s] {
      Status aborted(Code::kAborted, "the ucx transport was shut down");
      for (auto& [token, p] : s->pending) p.state->PartDone(aborted);
      s->pending.clear();
      for (const auto& conn : s->conns) conn->Close();
      s->conns.clear();
      for (ucp_ep_h ep : s->accepted) CloseEndpoint(ep);
      s->accepted.clear();
      if (s->index == 0) accepting_ = false;
    });
  }
}

Result<TransportData> Core::Register(const std::shared_ptr<Region>& region) {
  if (region->kind == MemoryKind::kCuda) {
    // Staged: peers reach it only through active messages, never by RMA.
    std::lock_guard<std::mutex> lock(regions_mu_);
    regions_[static_cast<uint64_t>(region->id)] = Registered{region, nullptr};
    return TransportData{"ucx", "staged"};
  }
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = region->base;
  params.length = region->size;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) return FromUcs(st, "ucp_mem_map");
  void* rkey = nullptr;
  size_t rkey_size = 0;
  st = ucp_rkey_pack(context_, memh, &rkey, &rkey_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return FromUcs(st, "ucp_rkey_pack");
  }
  TransportData data{"ucx", std::string(static_cast<const char*>(rkey), rkey_size)};
  ucp_rkey_buffer_release(rkey);
  std::lock_guard<std::mutex> lock(regions_mu_);
  regions_[static_cast<uint64_t>(region->id)] = Registered{region, memh};
  return data;
}

void Core::Deregister(const Region& region) {
  ucp_mem_h memh = nullptr;
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    auto it = regions_.find(static_cast<uint64_t>(region.id));
    if (it == regions_.end()) return;
    memh = it->second.memh;
    regions_.erase(it);  // active messages to the region fail from now on
  }
  if (memh == nullptr) return;  // staged: no remote key was handed out
  // Peers may hold its remote key: have each drop it and complete the RMA it posted before the
  // memory is unmapped. A peer that does not answer in time is dead or hung; go on without it.
  auto state = std::make_shared<TransferState>(TransferId{}, 0, TransferPath{"ucx", false},
                                               Deadline::After(std::chrono::seconds(5)));
  Shard* s0 = shards_[0].get();
  bool submitted = s0->worker->Submit([s0, state, id = static_cast<uint64_t>(region.id)] {
    for (ucp_ep_h ep : s0->accepted) {
      state->AddParts(1);
      AmHeader h;
      h.type = MsgType::kRevoke;
      h.region = id;
      h.token = s0->AddPending(Pending{state, nullptr, ep});
      s0->Send(ep, h, nullptr, {});
    }
    state->PartDone(Status::Ok());
  });
  if (submitted) {
    Status s = state->Wait(Deadline());
    // A peer whose connection closed cannot write any more; one that timed out is worth a word.
    if (s.code() == Code::kDeadlineExceeded)
      FERRY_LOG_WARN("ucx: deregistering region {}: a peer did not confirm in time",
                     static_cast<uint64_t>(region.id));
  }
  ucp_mem_unmap(context_, memh);
}

Status Core::Call(const std::shared_ptr<Conn>& conn, AmHeader h, std::string payload, Deadline deadline) {
  auto state = std::make_shared<TransferState>(TransferId{}, 0, TransferPath{"ucx", false}, deadline);
  state->AddParts(1);
  Shard& s = conn->shard();
  bool ok = s.worker->Submit([&s, conn, state, h, payload = std::move(payload)]() mutable {
    if (conn->failed()) return state->PartDone(conn->failure());
    h.token = s.AddPending(Pending{state, conn.get(), nullptr});
    s.Send(conn->ep(0), h, nullptr, std::move(payload), /*eager=*/true);
  });
  if (!ok) return Status(Code::kAborted, "the ucx transport was shut down");
  state->PartDone(Status::Ok());
  return state->Wait(Deadline());
}

bool Core::Poll() {
  bool any = false;
  for (auto& s : shards_) any = s->worker->TryProgress() || any;
  return any;
}

std::shared_ptr<Region> Core::FindRegion(uint64_t id) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = regions_.find(id);
  return it == regions_.end() ? nullptr : it->second.region;
}

bool Core::UseRma(const Conn& conn) const {
  switch (options_.rma) {
    case UcxOptions::Rma::kAlways: return true;
    case UcxOptions::Rma::kNever: return false;
    case UcxOptions::Rma::kAuto: break;
  }
  // RDMA verbs: native one-sided RMA, on this host and across hosts. Without them, active
  // messages: over TCP UCX emulates RMA, and between processes of one host UCX's put into
  // memory it did not allocate went through cross-memory attach at 1.4 GB/s here, against
  // 3.1-4.4 GB/s for active messages (bench/results/ucx_two_process.md).
  return rma_.network_native;
}

TokenSource::TokenSource() {
  std::random_device rd;
  key_ = (uint64_t{rd()} << 32) ^ rd();
}

uint64_t TokenSource::Next() {
  for (;;) {
    // The splitmix64 finalizer: a bijection of 64-bit words.
    uint64_t z = ++counter_ ^ key_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    if (z != 0) return z;
  }
}

uint64_t Shard::AddPending(Pending p) {
  uint64_t token = tokens.Next();
  pending.emplace(token, std::move(p));
  return token;
}

void Shard::FailPending(const Conn* conn, ucp_ep_h accepted_ep, const Status& why) {
  for (auto it = pending.begin(); it != pending.end();) {
    if ((conn != nullptr && it->second.conn == conn) ||
        (accepted_ep != nullptr && it->second.accepted == accepted_ep)) {
      it->second.state->PartDone(why);
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
}

void Core::Reject(const char* why) {
  uint64_t n = rejected_.fetch_add(1, std::memory_order_relaxed) + 1;
  // Log the first few, then every 1000th: a hostile peer must not flood the log.
  if (n <= 8 || n % 1000 == 0) FERRY_LOG_WARN("ucx: rejected message #{}: {}", n, why);
}

void Shard::Send(ucp_ep_h ep, const AmHeader& h, const void* data, std::string payload, bool eager,
                 std::shared_ptr<void> hold) {
  auto* ctx = new SendCtx();
  EncodeHeader(h, ctx->header);
  ctx->payload = std::move(payload);
  ctx->hold = std::move(hold);
  const void* buffer = data != nullptr ? data : ctx->payload.data();
  size_t size = data != nullptr ? h.size : ctx->payload.size();
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &OnSendDone;
  p.user_data = ctx;
  // The receiver answers on the reply endpoint; acks, read responses and one-way
  // notifications get no answer, so they go without it (no endpoint lookup at the receiver).
  const bool answered = h.type != MsgType::kAck && h.type != MsgType::kReadResp &&
                        !(h.type == MsgType::kNotify && h.token == 0);
  p.flags = (answered ? UCP_AM_SEND_FLAG_REPLY : 0) | (eager ? UCP_AM_SEND_FLAG_EAGER : 0);
  ctx->in_flight = &sends_in_flight;
  FERRY_TSAN_WIRE_RELEASE();
  void* req = ucp_am_send_nbx(ep, kAmId, ctx->header, kAmHeaderBytes, buffer, size, &p);
  if (UCS_PTR_IS_PTR(req)) ++sends_in_flight;
  else delete ctx;  // done at once, or failed (the peer's error handler reports it)
}

void Shard::SendAck(ucp_ep_h ep, uint64_t token, Code code) {
  AmHeader h;
  h.type = MsgType::kAck;
  h.token = token;
  h.code = static_cast<uint8_t>(code);
  Send(ep, h, nullptr, std::string());
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* core = static_cast<Core*>(arg);
  if (!core->accepting_) {
    core->last_conn_request_ = std::chrono::steady_clock::now();
    core->refused_.push_back(request);
    return;
  }
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnAcceptedError;
  params.err_handler.arg = core;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(core->shards_[0]->worker->handle(), &params, &ep);
  if (st != UCS_OK) {
    FERRY_LOG_WARN("ucx: cannot accept a connection: {}", ucs_status_string(st));
    return;
  }
  core->shards_[0]->accepted.insert(ep);
}

void Core::OnAcceptedError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* core = static_cast<Core*>(arg);
  FERRY_LOG_DEBUG("ucx: a peer's connection closed: {}", ucs_status_string(status));
  Shard& s0 = *core->shards_[0];
  if (s0.accepted.erase(ep) == 0) return;
  s0.FailPending(nullptr, ep, Status(Code::kUnavailable, "a peer's connection closed"));
  CloseEndpoint(ep);
}

}  // namespace ferry::internal::ucx
