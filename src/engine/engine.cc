#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>

#include "base/auth.h"
#include "base/log.h"
#include "cuda/copy_engine.h"
#include "cuda/runtime.h"
#include "engine/engine_core.h"

namespace ferry {
namespace internal {
namespace {

std::string DefaultKey() {
  char host[128] = {};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  char suffix[17];
  snprintf(suffix, sizeof(suffix), "%08x%08x", rd(), rd());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + suffix;
}

// How long deregistration waits for transfers still using a region: a transfer that passed its
// deadline may still be copying, and a GPU copy always finishes, so by default wait at least
// 10 s even when the engine's default deadline is shorter. A region still in use after that
// keeps its page lock (a late copy may still touch it).
Deadline RetireDeadline(const EngineOptions& options) {
  if (options.deregister_timeout) return Deadline::After(*options.deregister_timeout);
  return Deadline::After(std::max<Duration>(options.default_deadline, std::chrono::seconds(10)));
}

// Counts and sizes of EngineOptions outside their ranges are kInvalidArgument (the transports
// check their own options).
Status CheckOptions(const EngineOptions& o) {
  auto invalid = [](std::string what) { return Status(Code::kInvalidArgument, std::move(what)); };
  if (o.key.size() > kMaxKeyBytes)
    return invalid("engine key is longer than " + std::to_string(kMaxKeyBytes));
  if (o.default_deadline <= Duration::zero())
    return invalid("default_deadline must be positive, not " + std::to_string(o.default_deadline.count()) + " ns");
  if (o.deregister_timeout && *o.deregister_timeout <= Duration::zero())
    return invalid("deregister_timeout must be positive, not " + std::to_string(o.deregister_timeout->count()) + " ns");
  if (o.wait_spin < Duration::zero() || o.wait_spin > std::chrono::seconds(1))
    return invalid("wait_spin must be in [0, 1 s], not " + std::to_string(o.wait_spin.count()) + " ns");
  if (o.copy_threads < 0 || o.copy_threads > kMaxCopyThreads)
    return invalid("copy_threads must be in 0.." + std::to_string(kMaxCopyThreads) + " (0: one per core, at most 8), not " +
                   std::to_string(o.copy_threads));
  if (o.max_pending_notifications < 1 || o.max_pending_notifications > kMaxPendingNotifications)
    return invalid("max_pending_notifications must be in 1.." + std::to_string(kMaxPendingNotifications) + ", not " +
                   std::to_string(o.max_pending_notifications));
  if (o.max_pending_notifications_per_peer > o.max_pending_notifications)
    return invalid("max_pending_notifications_per_peer must be in 0..max_pending_notifications (" +
                   std::to_string(o.max_pending_notifications) + "; 0: a quarter of it, at least 64), not " +
                   std::to_string(o.max_pending_notifications_per_peer));
  if (o.max_notification_bytes < 1 || o.max_notification_bytes > o.max_pending_notification_bytes)
    return invalid("max_notification_bytes must be in 1..max_pending_notification_bytes (" +
                   std::to_string(o.max_pending_notification_bytes) + "), not " +
                   std::to_string(o.max_notification_bytes));
  if (o.max_pending_notification_bytes > kMaxPendingNotificationBytes)
    return invalid("max_pending_notification_bytes must be at most " + std::to_string(kMaxPendingNotificationBytes) +
                   ", not " + std::to_string(o.max_pending_notification_bytes));
  constexpr auto kMaxWait = std::chrono::hours(24);
  if (o.metrics_port < -1 || o.metrics_port > 65535)
    return invalid("metrics_port must be in -1..65535 (0: off, -1: a free port), not " + std::to_string(o.metrics_port));
  if (o.shm.revoke_timeout <= Duration::zero() || o.shm.revoke_timeout > kMaxWait)
    return invalid("shm.revoke_timeout must be in (0, 24 h], not " + std::to_string(o.shm.revoke_timeout.count()) + " ms");
  if (o.shm.call_timeout <= Duration::zero() || o.shm.call_timeout > kMaxWait)
    return invalid("shm.call_timeout must be in (0, 24 h], not " + std::to_string(o.shm.call_timeout.count()) + " ms");
  if (o.shm.max_connections < 1 || o.shm.max_connections > kMaxShmConnections)
    return invalid("shm.max_connections must be in 1.." + std::to_string(kMaxShmConnections) + ", not " +
                   std::to_string(o.shm.max_connections));
  if (o.shm.allowed_uids.size() > 4096)
    return invalid("shm.allowed_uids lists " + std::to_string(o.shm.allowed_uids.size()) + " users, more than 4096");
  return Status::Ok();
}

bool Carries(const Capabilities& caps, MemoryKind kind) {
  return kind == MemoryKind::kHost ? caps.host_memory : caps.cuda_memory;
}

// RegionOptions::allowed_peers checked, sorted and deduplicated, with this engine's own key
// added to a non-empty list (Region::allowed_peers).
Result<std::vector<std::string>> AccessList(const RegionOptions& o, const std::string& self) {
  if (o.allowed_peers.empty()) return std::vector<std::string>{};
  if (o.allowed_peers.size() > 1024) return Status(Code::kInvalidArgument, "allowed_peers has more than 1024 keys");
  for (const std::string& k : o.allowed_peers)
    if (k.empty() || k.size() > kMaxKeyBytes)
      return Status(Code::kInvalidArgument, "allowed_peers holds an empty key or one over " +
                                                std::to_string(kMaxKeyBytes) + " bytes");
  std::vector<std::string> keys = o.allowed_peers;
  keys.push_back(self);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace

EngineCore::EngineCore(const EngineOptions& options) : options_(options) {}

EngineCore::~EngineCore() {
  // First: the server's thread reads the engine's state.
  metrics_server_.reset();
  Shutdown();
}

Result<std::shared_ptr<EngineCore>> EngineCore::Create(const EngineOptions& options) {
  return Create(options, RegisteredTransports());
}

Result<std::shared_ptr<EngineCore>> EngineCore::Create(const EngineOptions& options,
                                                       std::span<const TransportEntry> entries) {
  FERRY_RETURN_IF_ERROR(CheckOptions(options));
  FERRY_RETURN_IF_ERROR(auth::LoadSecret(options.secret, options.secret_file).status());
  std::shared_ptr<EngineCore> core(new EngineCore(options));
  if (core->options_.key.empty()) core->options_.key = DefaultKey();
  core->inbox_ = std::make_shared<Inbox>(options.max_pending_notifications, options.max_notification_bytes,
                                         options.max_pending_notification_bytes,
                                         options.max_pending_notifications_per_peer);

  core->copy_engines_ = std::make_shared<cuda::CopyEngines>();
  FERRY_ASSIGN_OR_RETURN(core->completions_, Completions::Create());
  // The transports carry a topic frame beside each notification.
  core->transport_options_ = core->options_;
  core->transport_options_.max_notification_bytes += kNotifyFrameOverhead;
  TransportContext ctx{core->options_.key, &core->transport_options_, core->inbox_, core->copy_engines_};
  std::map<std::string, Status, std::less<>> unusable;  // why each transport asked for failed
  for (const TransportEntry& entry : entries) {
    if (!options.transports.empty() &&
        std::find(options.transports.begin(), options.transports.end(), entry.name) ==
            options.transports.end())
      continue;
    auto transport = entry.make(ctx);
    // Options out of range, or threads that cannot start, are the caller's to fix: the
    // engine does not start without the transport.
    if (!transport.ok() && (transport.status().code() == Code::kInvalidArgument ||
                            transport.status().code() == Code::kResourceExhausted))
      return transport.status().WithContext("transport " + std::string(entry.name));
    if (!transport.ok()) {
      FERRY_LOG_INFO("transport {} is not usable here: {}", entry.name, transport.status().ToString());
      unusable.emplace(std::string(entry.name), transport.status());
      continue;
    }
    core->transports_.push_back(std::move(transport).value());
  }
  for (const std::string& wanted : options.transports) {
    bool found = std::any_of(core->transports_.begin(), core->transports_.end(),
                             [&](const auto& t) { return t->name() == wanted; });
    if (found) continue;
    auto why = unusable.find(wanted);
    if (why != unusable.end())
      return Status(Code::kUnavailable, "transport '" + wanted + "' is not usable here: " + why->second.ToString());
    return Status(Code::kUnavailable, "transport '" + wanted + "' is not in this build");
  }
  if (core->transports_.empty()) return Status(Code::kUnavailable, "no transport is usable");
  if (options.metrics_port != 0) {
    // The core outlives its server: ~EngineCore stops the server first.
    EngineCore* raw = core.get();
    FERRY_ASSIGN_OR_RETURN(core->metrics_server_,
                           MetricsServer::Start(options.metrics_port < 0 ? 0 : options.metrics_port,
                                                [raw] { return RenderPrometheus(raw->metrics_snapshot()); }));
  }
  std::stable_sort(core->transports_.begin(), core->transports_.end(),
                   [](const auto& a, const auto& b) { return a->caps().cost < b->caps().cost; });

  core->desc_.key = core->options_.key;
  core->desc_.host_id = LocalHostId();
  core->desc_.pid = static_cast<uint32_t>(getpid());
  for (const auto& t : core->transports_) {
    core->desc_.transports.push_back(t->Describe());
    for (auto& a : t->Addresses()) core->desc_.addresses.push_back(std::move(a));
  }
  return core;
}

void EngineCore::Shutdown() {
  if (closed_.exchange(true)) return;
  std::unordered_map<uint64_t, RegionEntry> regions;
  {
    MutexLock lock(&mu_);
    regions.swap(regions_);
    endpoints_.clear();
    notify_endpoints_.clear();
    peers_.clear();
  }
  // Connections first: transfers waiting on a peer fail at once and release their regions, and
  // no peer can write any more; then wait for local copies still running.
  for (const auto& t : transports_) t->Shutdown();
  for (auto& [id, entry] : regions) {
    Status s = entry.region->Retire(RetireDeadline(options_));
    if (!s.ok()) FERRY_LOG_WARN("engine shutdown: {}", s.ToString());
    // A retiring region left the transports already (DeregisterMemory), but for those a peer
    // still held it in.
    if (!entry.retiring) {
      for (const auto& t : transports_) (void)t->Deregister(*entry.region);
    } else {
      for (size_t i : entry.holding) (void)transports_[i]->Deregister(*entry.region);
    }
    if (entry.region->pinned && s.ok()) (void)cuda::HostUnregister(entry.region->base);
  }
  // The callbacks of the transfers that shutting down failed run before this returns.
  if (completions_) completions_->Stop();
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  for (const auto& t : transports_) {
    s.rejected_messages += t->rejected_messages();
    s.auth_failures += t->auth_failures();
    s.connections_refused += t->connections_refused();
  }
  cuda::AddTo(copy_engines_->stats(), &s);
  s.rejected_messages += inbox_->rejected();  // notification frames that did not decode
  s.dropped_notifications = inbox_->dropped();
  s.merged_ops = merged_ops_.load(std::memory_order_relaxed);
  s.access_denied = access_denials_->count();
  return s;
}

MetricsSnapshot EngineCore::metrics_snapshot() const {
  MetricsSnapshot m;
  m.engine = options_.key;
  m.series = metrics_->SnapshotSeries();
  for (const char* cause : {"peer_dead", "deadline", "rejected", "out_of_range", "aborted", "other"})
    m.failures[cause] = 0;
  for (const SeriesSnapshot& s : m.series) {
    for (const auto& [name, n] : s.results) {
      for (int c = 1; c <= static_cast<int>(Code::kInProgress); ++c)
        if (CodeName(static_cast<Code>(c)) == name) m.failures[std::string(FailureCause(static_cast<Code>(c)))] += n;
    }
  }
  m.transfers_in_flight = metrics_->in_flight();
  {
    MutexLock lock(&mu_);
    m.peers = peers_.size();
    m.registered_regions = regions_.size();
    for (const auto& [id, entry] : regions_) m.registered_bytes += entry.region->size;
  }
  const EngineStats s = stats();
  m.dropped_notifications = s.dropped_notifications;
  m.rejected_messages = s.rejected_messages;
  m.auth_failures = s.auth_failures;
  m.connections_refused = s.connections_refused;
  m.access_denied = s.access_denied;
  return m;
}

std::vector<std::string> EngineCore::transport_names() const {
  std::vector<std::string> out;
  for (const auto& t : transports_) out.emplace_back(t->name());
  return out;
}

std::vector<TransportInfo> EngineCore::transport_info() const {
  std::vector<TransportInfo> out;
  for (const auto& t : transports_) {
    const Capabilities c = t->caps();
    const char* reach = c.reach == Reach::kSameProcess ? "process" : c.reach == Reach::kSameHost ? "host" : "network";
    out.push_back(TransportInfo{std::string(t->name()), c.host_memory, c.cuda_memory, c.notifications, reach});
  }
  return out;
}

Result<MemoryDesc> EngineCore::RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind, int device,
                                              const RegionOptions& region_options) {
  if (closed()) return Status(Code::kAborted, "the engine was shut down");
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> allowed, AccessList(region_options, options_.key));
  if (ptr == nullptr || bytes == 0)
    return Status(Code::kInvalidArgument, "cannot register a null or empty region");
  if (bytes > UINT64_MAX - reinterpret_cast<uint64_t>(ptr))
    return Status(Code::kInvalidArgument, "region wraps around the address space");
  auto region = std::make_shared<Region>();
  region->id = static_cast<RegionId>(next_region_.fetch_add(1));
  region->base = static_cast<std::byte*>(ptr);
  region->size = bytes;
  region->kind = kind;
  region->allowed_peers = std::move(allowed);
  region->denials = access_denials_;

  if (kind == MemoryKind::kCuda) {
    if (!cuda::Available())
      return Status(Code::kFailedPrecondition, "cannot register CUDA memory: " + cuda::UnavailableReason());
    FERRY_ASSIGN_OR_RETURN(cuda::PointerInfo info, cuda::QueryPointer(ptr));
    if (!info.device_memory)
      return Status(Code::kInvalidArgument, "pointer is not CUDA device memory");
    if (device >= 0 && device != info.device)
      return Status(Code::kInvalidArgument, "pointer lives on device " + std::to_string(info.device) +
                                                ", not " + std::to_string(device));
    // A build without machine code (or PTX) for this GPU fails here, clearly, rather than at
    // its first transfer.
    FERRY_RETURN_IF_ERROR(cuda::KernelsLoad(info.device));
    region->device = info.device;
  } else {
    if (device != -1) return Status(Code::kInvalidArgument, "host memory takes device -1");
    if (options_.pin_host_memory && cuda::Available()) {
      region->pinned = cuda::HostRegister(ptr, bytes).ok();
    }
  }

  MemoryDesc desc;
  desc.engine_key = options_.key;
  desc.region = region->id;
  desc.address = reinterpret_cast<uint64_t>(ptr);
  desc.size = bytes;
  desc.kind = kind;
  desc.device = region->device;
  desc.host_id = LocalHostId();
  for (const auto& t : transports_) {
    if (!Carries(t->caps(), kind)) continue;
    auto access = t->Register(region);
    if (!access.ok()) {
      // kUnsupported: the transport does not apply to this memory (e.g. shm and heap memory).
      if (access.status().code() == Code::kUnsupported)
        FERRY_LOG_DEBUG("transport {} does not carry this region: {}", t->name(), access.status().ToString());
      else
        FERRY_LOG_WARN("transport {} cannot register region: {}", t->name(), access.status().ToString());
      continue;
    }
    desc.access.push_back(std::move(access).value());
  }
  if (desc.access.empty()) {
    if (region->pinned) (void)cuda::HostUnregister(ptr);
    return Status(Code::kUnavailable, "no transport can carry " + std::string(MemoryKindName(kind)) + " memory");
  }
  if (region->restricted() && options_.secret.empty() && options_.secret_file.empty() &&
      !warned_unauthenticated_.exchange(true))
    FERRY_LOG_WARN("engine {}: a region with an access list, but no EngineOptions::secret: peers' keys are "
                   "claims, not proven, so the list stops mistakes, not attackers (logged once)", options_.key);
  MutexLock lock(&mu_);
  regions_[static_cast<uint64_t>(region->id)] = RegionEntry{region, desc};
  return desc;
}

Status EngineCore::DeregisterMemory(RegionId id) {
  const uint64_t key = static_cast<uint64_t>(id);
  std::shared_ptr<Region> region;
  std::vector<size_t> ask;  // the transports this call takes the region out of
  {
    MutexLock lock(&mu_);
    auto it = regions_.find(key);
    if (it == regions_.end())
      return Status(Code::kNotFound, "region " + std::to_string(key) + " is not registered");
    region = it->second.region;
    if (!it->second.retiring) {
      for (size_t i = 0; i < transports_.size(); ++i) ask.push_back(i);
    } else {
      ask.swap(it->second.holding);
    }
    it->second.retiring = true;
  }
  // A transport whose peer still holds the region (a peer process copying into GPU memory)
  // keeps it: the region stays known, retiring, and a retry asks that transport again.
  std::vector<size_t> holding;
  Status held;
  for (size_t i : ask) {
    Status s = transports_[i]->Deregister(*region);
    if (s.ok()) continue;
    holding.push_back(i);
    if (held.ok()) held = s;
  }
  if (!holding.empty()) {
    MutexLock lock(&mu_);
    auto it = regions_.find(key);
    if (it != regions_.end() && it->second.region == region) {
      auto& h = it->second.holding;
      h.insert(h.end(), holding.begin(), holding.end());
    }
    return Status(Code::kDeadlineExceeded, std::string(held.message()))
        .WithContext("deregistration not finished; call DeregisterMemory again to retry");
  }
  // A region still in use when the wait ends stays known, retiring: a later call waits again
  // and frees it once its last transfer let go.
  FERRY_RETURN_IF_ERROR(region->Retire(RetireDeadline(options_))
                            .WithContext("deregistration not finished; call DeregisterMemory again to retry"));
  {
    MutexLock lock(&mu_);
    auto it = regions_.find(key);
    // Another call (or Shutdown) that finished the same retirement frees it.
    if (it == regions_.end() || it->second.region != region) return Status::Ok();
    regions_.erase(it);
  }
  if (region->pinned) (void)cuda::HostUnregister(region->base);
  return Status::Ok();
}

Result<std::shared_ptr<SessionCore>> EngineCore::OpenSession(const MemoryDesc& local, const MemoryDesc& remote) {
  if (closed()) return Status(Code::kAborted, "the engine was shut down");
  if (local.engine_key != options_.key)
    return Status(Code::kInvalidArgument, "local descriptor belongs to engine " + local.engine_key);
  std::shared_ptr<Region> region;
  MemoryDesc local_desc;
  {
    MutexLock lock(&mu_);
    auto it = regions_.find(static_cast<uint64_t>(local.region));
    if (it == regions_.end())
      return Status(Code::kFailedPrecondition,
                    "local region " + std::to_string(static_cast<uint64_t>(local.region)) + " is not registered");
    if (it->second.retiring)
      return Status(Code::kFailedPrecondition,
                    "local region " + std::to_string(static_cast<uint64_t>(local.region)) + " is being deregistered");
    region = it->second.region;
    local_desc = it->second.desc;
  }
  FERRY_ASSIGN_OR_RETURN(EngineDesc peer, FindPeer(remote.engine_key));
  Status last(Code::kUnavailable, std::string("no transport can carry ") +
                                      std::string(MemoryKindName(local.kind)) + " -> " +
                                      std::string(MemoryKindName(remote.kind)) + " memory to " + peer.key);
  for (size_t i = 0; i < transports_.size(); ++i) {
    Transport& t = *transports_[i];
    Capabilities caps = t.caps();
    if (!Carries(caps, local.kind) || !Carries(caps, remote.kind)) continue;
    if (remote.FindAccess(t.name()) == nullptr || !t.CanReach(peer)) continue;
    auto endpoint = GetEndpoint(peer, i);
    if (!endpoint.ok()) {
      last = endpoint.status();
      continue;
    }
    auto channel = (*endpoint)->OpenChannel(region, remote);
    if (!channel.ok()) {
      // The target's access list refused this engine: another transport would be refused
      // too (and counted again there).
      if (channel.status().code() == Code::kPermissionDenied) return channel.status();
      last = channel.status();
      continue;
    }
    // A transport without notifications of its own (e.g. cuda_ipc) has the session's
    // notifications routed through another transport that reaches the peer; they still leave
    // only once the batch's data is complete (the transfer's continuation).
    std::shared_ptr<Endpoint> notify = *endpoint;
    if (!caps.notifications) {
      auto routed = NotificationEndpoint(peer);
      notify = routed.ok() ? std::move(routed).value() : nullptr;
    }
    return std::make_shared<SessionCore>(shared_from_this(), local_desc, remote, region,
                                         std::move(endpoint).value(), std::move(channel).value(),
                                         std::move(notify));
  }
  return last;
}

}  // namespace internal

// Engine: the public handle.

Engine::Engine(std::shared_ptr<internal::EngineCore> core) : core_(std::move(core)) {}
Engine::~Engine() { core_->Shutdown(); }

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  FERRY_ASSIGN_OR_RETURN(auto core, internal::EngineCore::Create(options));
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

const std::string& Engine::key() const { return core_->key(); }
EngineDesc Engine::Describe() const { return core_->desc(); }
std::vector<std::string> Engine::transports() const { return core_->transport_names(); }
std::vector<TransportInfo> Engine::transport_info() const { return core_->transport_info(); }
Result<MemoryDesc> Engine::RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind, int device) {
  return core_->RegisterMemory(ptr, bytes, kind, device, RegionOptions{});
}
Result<MemoryDesc> Engine::RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind, int device,
                                          const RegionOptions& options) {
  return core_->RegisterMemory(ptr, bytes, kind, device, options);
}
Status Engine::DeregisterMemory(RegionId region) { return core_->DeregisterMemory(region); }
Status Engine::AddPeer(const EngineDesc& peer) { return core_->AddPeer(peer); }
Status Engine::RemovePeer(std::string_view key) { return core_->RemovePeer(key); }
Status Engine::FencePeer(std::string_view key, Duration timeout) { return core_->FencePeer(key, timeout); }
Result<Session> Engine::OpenSession(const MemoryDesc& local, const MemoryDesc& remote) {
  FERRY_ASSIGN_OR_RETURN(auto core, core_->OpenSession(local, remote));
  return Session(std::move(core));
}
TransferId Engine::AllocateTransferId() { return core_->AllocateTransferId(); }
EngineStats Engine::stats() const { return core_->stats(); }
MetricsSnapshot Engine::Metrics() const { return core_->metrics_snapshot(); }
std::vector<InFlightTransfer> Engine::InFlight() const { return core_->in_flight(); }
int Engine::MetricsPort() const { return core_->metrics_port(); }

std::string_view Version() { return FERRY_VERSION; }

}  // namespace ferry
