// Core's life (core.h): creation, the listener, registration and shutdown. Connections
// (admitting and dialling): core_connect.cc; sending and the tables of waiting operations:
// shard.cc; receiving: handlers.cc.
#include "transport/ucx/core.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>

#include "base/host_port.h"
#include "base/auth.h"
#include "base/log.h"

namespace ferry::internal::ucx {
namespace {

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

// UCX (1.13) lists its network devices once, when the context is made, and keeps only the
// interfaces that are up and running then (as ucs_netif_is_active decides); one that comes up
// later is never added. An engine made while the interface holding listen_host is down would
// be created without error and stay unreachable for its whole life (peers' endpoints back to it
// fail with "Destination is unreachable"). Refuse it with kUnavailable instead, so that a
// supervisor retries once the link is up. Only an address this host holds is checked: a
// wildcard or a name left to the resolver is not.
Status CheckListenLink(const std::string& listen_host) {
  std::string host = listen_host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in_addr v4{};
  in6_addr v6{};
  const bool is4 = inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool is6 = !is4 && inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is4 && !is6) return Status::Ok();
  if ((is4 && v4.s_addr == htonl(INADDR_ANY)) || (is6 && IN6_IS_ADDR_UNSPECIFIED(&v6))) return Status::Ok();
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Status::Ok();  // cannot tell; the door's bind decides
  std::string down;
  bool active = false;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    bool match = false;
    if (is4 && i->ifa_addr->sa_family == AF_INET)
      match = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    if (is6 && i->ifa_addr->sa_family == AF_INET6)
      match = memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &v6, sizeof(v6)) == 0;
    if (!match) continue;
    if ((i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING)) active = true;
    else if (down.empty()) down = i->ifa_name;
  }
  freeifaddrs(ifs);
  if (active || down.empty()) return Status::Ok();
  return Status(Code::kUnavailable, "ucx.listen_host " + listen_host + " is on network interface " + down +
                                        ", which is down (no carrier or not up); UCX picks its devices when the "
                                        "engine is made and would never use it: retry once the link is up");
}

// UCX's TCP transport moves a message in segments of UCX_TCP_TX_SEG_SIZE (8 KiB by default)
// and receives into UCX_TCP_RX_SEG_SIZE (64 KiB): a 1 MiB write is 128 sends and as many
// progress rounds. With 256 KiB segments, ferry's 1 MiB writes over TCP went from 0.62 to 0.77
// of ucx_perftest's tag_bw (median of 5 rounds, 16-core host, bench/results/ucx_two_process.md),
// and writes up to 256 KiB (ferry's eager pieces) go as one eager message, not as zero-copy
// fragments (the path of UCX 1.13's `comp->count > 0` abort, bench/results/soak.md). The cost:
// a connection that is receiving holds one segment, at most ucx.max_connections x 256 KiB
// (docs/limits.md). UCX takes the transport's own names here (no TCP_ prefix); only TCP has
// them. A user who sets either variable keeps UCX's sizes and theirs.
constexpr char kTcpSegment[] = "256k";

void ApplyTcpDefaults(ucp_config_t* config) {
  if (std::getenv("UCX_TCP_TX_SEG_SIZE") != nullptr || std::getenv("UCX_TCP_RX_SEG_SIZE") != nullptr) return;
  for (const char* name : {"RX_SEG_SIZE", "TX_SEG_SIZE"}) {
    if (ucs_status_t st = ucp_config_modify(config, name, kTcpSegment); st != UCS_OK)
      FERRY_LOG_DEBUG("ucx: cannot set TCP {}: {}", name, ucs_status_string(st));
  }
}

}  // namespace

Result<std::shared_ptr<Core>> Core::Create(const TransportContext& ctx, std::unique_ptr<StageCopier> copier) {
  const UcxOptions& o = ctx.options->ucx;
  if (o.lanes < 1 || o.lanes > 64) return Status(Code::kInvalidArgument, "ucx.lanes must be in 1..64");
  if (o.workers < 1 || o.workers > 16) return Status(Code::kInvalidArgument, "ucx.workers must be in 1..16");
  if (o.post_batch < 1) return Status(Code::kInvalidArgument, "ucx.post_batch must be positive");
  if (o.max_am_bytes < 4096) return Status(Code::kInvalidArgument, "ucx.max_am_bytes must be >= 4096");
  if (o.max_pending_handshakes < 1 || o.max_pending_handshakes > 65536)
    return Status(Code::kInvalidArgument, "ucx.max_pending_handshakes must be in 1..65536");
  if (o.max_connections < 1 || o.max_connections > 1 << 20)
    return Status(Code::kInvalidArgument, "ucx.max_connections must be in 1..1048576");
  if (o.handshake_timeout <= std::chrono::milliseconds(0) || o.handshake_timeout > std::chrono::hours(1))
    return Status(Code::kInvalidArgument, "ucx.handshake_timeout must be in (0, 1 h]");
  if (o.connect_timeout <= std::chrono::milliseconds(0) || o.connect_timeout > std::chrono::hours(1))
    return Status(Code::kInvalidArgument, "ucx.connect_timeout must be in (0, 1 h]");
  FERRY_ASSIGN_OR_RETURN(std::string secret, auth::LoadSecret(ctx.options->secret, ctx.options->secret_file));
  FERRY_RETURN_IF_ERROR(CheckListenLink(o.listen_host));
  std::shared_ptr<Core> core(new Core());
  core->secret_ = std::move(secret);
  core->engine_key_ = ctx.engine_key;
  core->options_ = o;
  core->inbox_ = ctx.inbox;

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  ApplyTcpDefaults(config);
  st = ucp_init(&params, config, &core->context_);
  ucp_config_release(config);
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
    ucp_address_t* address = nullptr;
    size_t address_len = 0;
    st = ucp_worker_get_address(shard->worker->handle(), &address, &address_len);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
    shard->worker_address.assign(reinterpret_cast<const char*>(address), address_len);
    ucp_worker_release_address(shard->worker->handle(), address);
    if (address_len > kMaxWorkerAddressBytes)
      return Status(Code::kUnsupported, "this UCX worker's address has " + std::to_string(address_len) +
                                            " bytes, more than ferry's handshake carries (narrow UCX_NET_DEVICES)");
    core->shards_.push_back(std::move(shard));
  }
  FERRY_RETURN_IF_ERROR(core->Listen());
  core->stager_ = std::make_unique<Stager>(core.get(), std::move(copier));

  for (auto& shard : core->shards_) {
    Shard* raw = shard.get();
    FERRY_RETURN_IF_ERROR(raw->worker->Start([raw] { Forget(*raw); },
                                             [raw] { return !raw->pending.empty() || raw->sends_in_flight > 0; }));
  }
  return core;
}

// Forgets operations whose transfer already ended (deadline, failure), completing their part so
// the transfer lets go of its regions: a late answer for them is dropped, and a message still
// being sent holds its own region (see Send).
void Core::Forget(Shard& s) {
  // A target that dropped a connection of ours (its fence, or its end) closed the handshake's
  // socket: what is sent on the connection is refused from then on, so fail it, and the engine
  // connects anew (Endpoint::healthy).
  std::vector<std::shared_ptr<Conn>> closed;
  for (const auto& c : s.conns)
    if (!c->failed() && c->TargetClosed()) closed.push_back(c);
  for (const auto& c : closed) c->Fail(Status(Code::kUnavailable, "peer " + c->peer().key + " closed the connection"));
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
  DoorOptions d;
  d.host = options_.listen_host;
  d.port = options_.listen_port;
  d.key = engine_key_;
  d.max_pending = options_.max_pending_handshakes;
  d.max_connections = options_.max_connections;
  d.handshake_timeout = options_.handshake_timeout;
  d.secret = secret_;
  FERRY_ASSIGN_OR_RETURN(door_, Door::Create(
                                    d, [this](const Hello& h, Deadline deadline) { return Admit(h, deadline); },
                                    [this](uint64_t id) {
                                      Shard* s0 = shards_[0].get();
                                      (void)s0->worker->Submit([this, id] {
                                        DropAccepted(id, Status(Code::kUnavailable, "a peer closed its connection"));
                                      });
                                    }));
  const uint16_t port = door_->port();
  if (options_.listen_host != "0.0.0.0") {
    std::string host = options_.listen_host;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    addresses_.push_back(JoinHostPort(host, port));
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

uint64_t Core::refused_connections() const { return door_ ? door_->refused() : 0; }
uint64_t Core::auth_failures() const { return door_ ? door_->auth_failures() : 0; }
uint64_t Core::connections_refused() const { return door_ ? door_->limited() : 0; }

Core::~Core() {
  Shutdown();
  // Does not wait for GPU copies in flight: they finish on the engine's copy engines, which
  // outlive the transport (only a transport made alone, with a set of its own, waits here
  // for that set's copies), and their callbacks, finding the stager detached, fail their
  // parts with kAborted. Before shards_.clear(), so that no callback reaches a worker after.
  stager_.reset();
  MutexLock lock(&regions_mu_);
  for (auto& [id, r] : regions_)
    if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
  regions_.clear();
  door_.reset();
  shards_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
}

void Core::Shutdown() {
  if (shut_down_ || shards_.empty()) return;
  shut_down_ = true;
  // No new connections; the door's sockets close, so peers forget their connections here.
  if (door_) door_->Stop();
  // Shard 0 last: it holds the connections that peers opened.
  for (size_t i = shards_.size(); i-- > 0;) {
    Shard* s = shards_[i].get();
    s->worker->Stop([s] {
      Status aborted(Code::kAborted, "the ucx transport was shut down");
      for (auto& [token, p] : s->pending) p.state->PartDone(aborted);
      s->pending.clear();
      for (const auto& conn : s->conns) conn->Close();
      s->conns.clear();
      for (auto& [id, a] : s->accepted)
        for (ucp_ep_h ep : a->eps) CloseEndpoint(ep);
      s->accepted.clear();
      s->accepted_by_ep.clear();
    });
  }
}

Result<TransportData> Core::Register(const std::shared_ptr<Region>& region) {
  if (region->kind == MemoryKind::kCuda || region->restricted()) {
    // Staged (GPU memory), or a region with an access list: peers reach it only through
    // active messages, each checked against the list (FindRegion), never by RMA. An RDMA
    // remote key would let whoever holds the descriptor read and write the memory with no
    // question asked here, so none is made (nor is the memory mapped for RMA).
    const uint64_t key = RandomKey();
    MutexLock lock(&regions_mu_);
    regions_[static_cast<uint64_t>(region->id)] = Registered{region, nullptr, key};
    return TransportData{"ucx", PackAccess(key, region->kind == MemoryKind::kCuda ? kStagedAccess : kNoRemoteKey)};
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
  const uint64_t key = RandomKey();
  TransportData data{"ucx", PackAccess(key, std::string_view(static_cast<const char*>(rkey), rkey_size))};
  ucp_rkey_buffer_release(rkey);
  MutexLock lock(&regions_mu_);
  regions_[static_cast<uint64_t>(region->id)] = Registered{region, memh, key};
  return data;
}

void Core::Deregister(const Region& region) {
  ucp_mem_h memh = nullptr;
  {
    MutexLock lock(&regions_mu_);
    auto it = regions_.find(static_cast<uint64_t>(region.id));
    if (it == regions_.end()) return;
    memh = it->second.memh;
    regions_.erase(it);  // active messages to the region fail from now on
  }
  if (memh == nullptr) return;  // staged or restricted: no remote key was handed out
  // Peers may hold its remote key: have each drop it and complete the RMA it posted before the
  // memory is unmapped. A peer that does not answer in time is dead or hung; go on without it.
  auto state = std::make_shared<TransferState>(TransferId{}, 0, TransferPath{"ucx", false},
                                               Deadline::After(std::chrono::seconds(5)));
  Shard* s0 = shards_[0].get();
  bool submitted = s0->worker->Submit([s0, state, id = static_cast<uint64_t>(region.id)] {
    for (auto& [conn_id, a] : s0->accepted) {
      state->AddParts(1);
      AmHeader h;
      h.type = MsgType::kRevoke;
      h.region = id;
      h.conn = conn_id;
      h.token = s0->AddPending(Pending{state, nullptr, conn_id});
      s0->Send(a->ep(0), h, nullptr, {});
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

bool Core::Poll() {
  bool any = false;
  for (auto& s : shards_) any = s->worker->TryProgress() || any;
  return any;
}

std::shared_ptr<Region> Core::FindRegion(Shard& s, const AmHeader& h, Code* refusal) {
  *refusal = Code::kFailedPrecondition;
  std::shared_ptr<Region> region;
  {
    MutexLock lock(&regions_mu_);
    auto it = regions_.find(h.region);
    if (it == regions_.end()) return nullptr;
    // A wrong key is as good as no region: the caller rejects the message.
    if (it->second.key != h.key) return nullptr;
    region = it->second.region;
  }
  if (!region->restricted()) return region;
  // Who asks is the engine that made the connection (door.h), never what a message says.
  const Accepted* from = s.FindAccepted(h.conn);
  if (from == nullptr) return nullptr;
  if (!region->Admit("ucx", from->peer_key)) {
    *refusal = Code::kPermissionDenied;
    return nullptr;
  }
  return region;
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

void Core::Reject(const char* why) {
  uint64_t n = rejected_.fetch_add(1, std::memory_order_relaxed) + 1;
  // Log the first few, then every 1000th: a hostile peer must not flood the log.
  if (n <= 8 || n % 1000 == 0) FERRY_LOG_WARN("ucx: rejected message #{}: {}", n, why);
}

}  // namespace ferry::internal::ucx
