// EngineCore and SessionCore: the state behind the public Engine and Session handles.
// engine.cc holds the engine's registry (regions, peers, routes), notify.cc its notifications
// (topics, NotifyAfter), session.cc the posting of transfers, completions.h the completion
// thread (callbacks, deadlines), wait_many.cc WaitAll/WaitAny.
//
// Thread safety: EngineCore's maps are guarded by mu_; transports_ is fixed after Create.
// A SessionCore is immutable after OpenSession.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "engine/completions.h"
#include "engine/metrics.h"
#include "engine/metrics_server.h"
#include "engine/op_check.h"
#include "ferry/engine.h"
#include "transport/transport.h"

namespace ferry::internal {

// The state behind a public Transfer handle (null for an empty handle).
struct TransferAccess {
  static const std::shared_ptr<TransferState>& Of(const Transfer& t) { return t.state_; }
  static Transfer Make(std::shared_ptr<TransferState> s) { return Transfer(std::move(s)); }
};

// The wire bytes of `message` on `topic` (transport/notify_frame.h), after the engine's bounds:
// kInvalidArgument for a topic over kMaxTopicBytes or a message over max_notification_bytes.
Result<std::string> FrameNotification(const EngineOptions& options, std::string_view topic,
                                      std::string_view message);

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  static Result<std::shared_ptr<EngineCore>> Create(const EngineOptions& options);
  // The same, with the transports of `entries` instead of those compiled in (for tests).
  static Result<std::shared_ptr<EngineCore>> Create(const EngineOptions& options,
                                                    std::span<const TransportEntry> entries);
  ~EngineCore();

  // Stops the engine: later calls fail with kAborted; regions are retired.
  void Shutdown() EXCLUDES(mu_);
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  const EngineOptions& options() const { return options_; }
  const std::string& key() const { return options_.key; }
  const EngineDesc& desc() const { return desc_; }
  std::vector<std::string> transport_names() const;
  std::vector<TransportInfo> transport_info() const;

  Result<MemoryDesc> RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind, int device,
                                    const RegionOptions& region_options = {}) EXCLUDES(mu_);
  Status DeregisterMemory(RegionId region) EXCLUDES(mu_);
  Status AddPeer(const EngineDesc& peer) EXCLUDES(mu_);
  Status RemovePeer(std::string_view key) EXCLUDES(mu_);
  Status FencePeer(std::string_view key, Duration timeout);
  Result<std::shared_ptr<SessionCore>> OpenSession(const MemoryDesc& local, const MemoryDesc& remote)
      EXCLUDES(mu_);
  TransferId AllocateTransferId() {
    return static_cast<TransferId>(next_transfer_.fetch_add(1, std::memory_order_relaxed));
  }
  Status Notify(std::string_view peer_key, std::string_view message, std::string_view topic = {});
  Status NotifyUncounted(std::string_view peer_key, std::string_view message, std::string_view topic);
  Transfer NotifyAfter(std::string_view peer_key, std::string_view message,
                       std::span<const Transfer> after, const TransferOptions& options);
  // On an empty inbox, lets each transport progress once from this thread (Transport::Poll),
  // then looks again.
  void WatchNotifications(std::string_view topic, std::function<void()> on_arrival) {
    inbox_->Watch(topic, std::move(on_arrival));
  }
  std::vector<Notification> PopNotifications(std::string_view topic = {});
  // Where a peer's notifications go (cached per peer).
  Result<std::shared_ptr<Endpoint>> NotifyEndpointFor(std::string_view peer_key) EXCLUDES(mu_);
  // Hands `state` out as a Transfer: attaches `on_complete` (if set), and has the transfers
  // of `after` (already gated on) finish at their deadlines.
  // `series` (null: none) counts it in the metrics when it ends, with `ops` ops.
  Transfer Issue(std::shared_ptr<TransferState> state, const std::function<void(const Status&)>& on_complete,
                 std::span<const Transfer> after = {}, Series* series = nullptr, uint64_t ops = 0);
  Completions& completions() { return *completions_; }
  EngineStats stats() const;
  Metrics& metrics() { return *metrics_; }
  MetricsSnapshot metrics_snapshot() const EXCLUDES(mu_);
  std::vector<InFlightTransfer> in_flight() const { return metrics_->InFlight(); }
  // The port of the metrics endpoint (EngineOptions::metrics_port), 0 when off.
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  // Ops that Session::Post merged into the op before them (EngineStats::merged_ops).
  void CountMerged(uint64_t n) { merged_ops_.fetch_add(n, std::memory_order_relaxed); }

 private:
  explicit EngineCore(const EngineOptions& options);
  struct RegionEntry {
    std::shared_ptr<Region> region;
    MemoryDesc desc;
    // DeregisterMemory began: the transports let the region go, and it is freed (erased,
    // unpinned) once no transfer uses it; until then a retry of DeregisterMemory waits again.
    bool retiring = false;
    // Transports (indexes into transports_) that did not let the region go yet: a peer still
    // held it when their wait ended (Transport::Deregister); a retry asks them again.
    std::vector<size_t> holding;
  };
  Result<EngineDesc> FindPeer(std::string_view key) EXCLUDES(mu_);
  // Connects without mu_ held (a connection may take a handshake's time).
  Result<std::shared_ptr<Endpoint>> GetEndpoint(const EngineDesc& peer, size_t transport) EXCLUDES(mu_);
  // Drops the cached endpoints that are dead (Endpoint::dead): those of a peer that is never
  // asked for again would otherwise stay for the engine's life, each with what its transport
  // holds for it (over shm a ring). They are destroyed after mu_ is released.
  void PruneDeadEndpoints() EXCLUDES(mu_);
  // An endpoint of the first transport with notifications that reaches `peer`.
  Result<std::shared_ptr<Endpoint>> NotificationEndpoint(const EngineDesc& peer) EXCLUDES(mu_);

  EngineOptions options_;
  // options_ as the transports see them: notifications carry a topic frame beside the user's
  // message (max_notification_bytes + kNotifyFrameOverhead).
  EngineOptions transport_options_;
  std::shared_ptr<Completions> completions_;
  // Shared with the transfers' observers: a transfer may finish after the engine is gone.
  std::shared_ptr<Metrics> metrics_ = std::make_shared<Metrics>();
  std::unique_ptr<MetricsServer> metrics_server_;  // when options_.metrics_port != 0
  EngineDesc desc_;
  std::shared_ptr<Inbox> inbox_;
  // Shared by the transports (TransportContext::copy_engines); declared before transports_ so
  // that it outlives them, and the engine's end waits for GPU copies still in flight.
  std::shared_ptr<cuda::CopyEngines> copy_engines_;
  std::vector<std::unique_ptr<Transport>> transports_;  // sorted by cost; fixed after Create
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> next_region_{1};
  std::atomic<uint64_t> next_transfer_{1};
  std::atomic<uint64_t> merged_ops_{0};
  // Refusals of the regions' access lists (EngineStats::access_denied); each region points here.
  std::shared_ptr<AccessDenials> access_denials_ = std::make_shared<AccessDenials>();
  std::atomic<bool> warned_unauthenticated_{false};  // the warning of RegisterMemory, once

  mutable Mutex mu_;
  std::unordered_map<uint64_t, RegionEntry> regions_ GUARDED_BY(mu_);
  std::unordered_map<std::string, EngineDesc> peers_ GUARDED_BY(mu_);
  std::map<std::pair<std::string, size_t>, std::shared_ptr<Endpoint>> endpoints_ GUARDED_BY(mu_);
  // Where Notify() sends to each peer, so that a notification costs one lookup rather than a
  // copy of the peer's descriptor and a question to every transport. Emptied for a peer
  // whenever its descriptor changes (peers_generation_ counts the changes).
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::shared_ptr<Endpoint>, KeyHash, std::equal_to<>> notify_endpoints_
      GUARDED_BY(mu_);
  uint64_t peers_generation_ GUARDED_BY(mu_) = 0;
};

class SessionCore {
 public:
  // `notify`: where the session's notifications go; the data endpoint when its transport has
  // notifications, else another transport's endpoint to the peer (null when none reaches it).
  SessionCore(std::shared_ptr<EngineCore> engine, MemoryDesc local, MemoryDesc remote,
              std::shared_ptr<Region> local_region, std::shared_ptr<Endpoint> endpoint,
              std::unique_ptr<Channel> channel, std::shared_ptr<Endpoint> notify)
      : engine_(std::move(engine)), local_(std::move(local)), remote_(std::move(remote)),
        local_region_(std::move(local_region)), endpoint_(std::move(endpoint)),
        channel_(std::move(channel)), notify_(std::move(notify)), path_(channel_->path()),
        series_(engine_->metrics().SeriesFor("transfer", path_.transport, remote_.engine_key)) {}

  // Copies the caller's `ops` once, then posts the copy (PostOwned): another thread that
  // changes the caller's array meanwhile changes nothing that is checked or moved.
  Transfer Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const;
  // A batch of kReserveMinOps ops or more, copied and checked straight into the channel's own
  // storage where it offers some (Channel::ReserveOps: a GPU path's page-locked op buffer,
  // launched from as it lies), and posted from there: one pass over the ops, not two. None
  // when the batch is smaller or the channel offers no storage.
  std::optional<Transfer> PostReserved(Op op, std::span<const TransferOp> ops, const TransferOptions& options) const
      EXCLUDES(writes_mu_);
  static constexpr size_t kReserveMinOps = 4096;
  // Checks `ops` against both regions and posts them. REQUIRES: `ops` is the engine's own
  // storage, which no other thread can reach; it may be rewritten (runs merged in place).
  Transfer PostOwned(Op op, std::span<TransferOp> ops, const TransferOptions& options) const
      EXCLUDES(writes_mu_);
  // Posts `ops` (the engine's own, as for PostOwned) that CopyAndCheckOps checked as `check`;
  // `space`: the channel's storage they lie in (Channel::ReserveOps), or null.
  Transfer PostChecked(Op op, std::span<TransferOp> ops, const OpCheck& check, const TransferOptions& options,
                       OpSpace* space) const EXCLUDES(writes_mu_);
  const MemoryDesc& local() const { return local_; }
  const MemoryDesc& remote() const { return remote_; }
  const TransferPath& path() const { return path_; }
  bool connected() const { return endpoint_->healthy(); }

 private:
  std::shared_ptr<EngineCore> engine_;
  MemoryDesc local_;
  MemoryDesc remote_;
  std::shared_ptr<Region> local_region_;
  std::shared_ptr<Endpoint> endpoint_;
  std::unique_ptr<Channel> channel_;
  std::shared_ptr<Endpoint> notify_;
  TransferPath path_;
  Series* series_;  // this session's counters (engine_->metrics())
  // Writes posted and not yet finished, oldest first: a batch's notification leaves only once
  // every write posted before it has finished (its data is in place), so that a receiver that
  // has the notification has every byte the session wrote before it, whatever the order in
  // which lanes, workers or copy engines complete the batches.
  mutable Mutex writes_mu_;
  mutable std::vector<std::weak_ptr<TransferState>> writes_ GUARDED_BY(writes_mu_);
  mutable size_t prune_at_ GUARDED_BY(writes_mu_) = 64;
};

}  // namespace ferry::internal
