// The Connector's public calls, its peers, its messages and its worker thread. The request
// state machines are in connector_producer.cc and connector_consumer.cc.
#include <algorithm>
#include <utility>

#include "base/log.h"
#include "ferry/gpu.h"
#include "kv/connector_impl.h"

namespace ferry::kv {
namespace internal {

bool Mailbox::Push(Command c) {
  MutexLock l(&mu);
  if (closed) return false;
  commands.push_back(std::move(c));
  cv.NotifyOne();
  return true;
}

void Mailbox::Wake() {
  MutexLock l(&mu);
  woken = true;
  cv.NotifyOne();
}

ReadyQueue::~ReadyQueue() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void ReadyQueue::Push(ReadyFn ready, Done done) {
  MutexLock l(&mu_);
  items_.emplace_back(std::move(ready), std::move(done));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  cv_.NotifyOne();
}

void ReadyQueue::Run() {
  for (;;) {
    std::pair<ReadyFn, Done> item;
    {
      MutexLock l(&mu_);
      cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stop_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping with nothing left
      item = std::move(items_.front());
      items_.pop_front();
    }
    // On shutdown the remaining layers fail at once rather than wait on their GPU work.
    Status s;
    {
      MutexLock l(&mu_);
      if (stop_) s = Status(Code::kAborted, "the connector is shutting down");
    }
    if (s.ok()) s = item.first(timeout_);
    item.second(std::move(s));
  }
}

}  // namespace internal

namespace {

Status CheckRequestId(std::string_view request) {
  if (request.empty() || request.size() > kMaxRequestIdBytes) {
    return Status(Code::kInvalidArgument, "request id must be 1.." + std::to_string(kMaxRequestIdBytes) + " bytes");
  }
  return {};
}

// The producer ranks (of `ranks`, one instance's TP ranks in order) a consumer rank of `layout`
// exchanges a request's messages with.
Result<std::vector<internal::Source>> SourcesFor(const CacheLayout& layout,
                                                 const std::vector<std::shared_ptr<const WorkerMetadata>>& ranks) {
  TpPair pair{layout.total_kv_heads, layout.mla, ranks[0]->layout.tp_size, layout.tp_size};
  if (Status s = ValidateTpPair(pair); !s.ok()) return s;
  std::vector<internal::Source> sources;
  for (uint32_t r : SourcesOf(pair, layout.tp_rank)) {
    internal::Source src;
    src.rank = r;
    src.producer = ranks[r]->id;
    src.engine_key = ranks[r]->engine.key;
    sources.push_back(std::move(src));
  }
  return sources;
}

Status CheckBlocks(const CacheLayout& layout, std::span<const uint64_t> blocks) {
  if (blocks.size() > kMaxMessageBlocks) return Status(Code::kOutOfRange, "too many blocks for one request");
  for (uint64_t b : blocks) {
    if (b >= layout.num_blocks) {
      return Status(Code::kOutOfRange, "block " + std::to_string(b) + " is beyond the cache's " +
                                           std::to_string(layout.num_blocks) + " blocks");
    }
  }
  return {};
}

}  // namespace

ReadyFn EventReady(void* cuda_event) {
  return [cuda_event](Duration timeout) { return gpu::WaitEvent(cuda_event, timeout); };
}

Connector::Impl::Impl(Engine* e, const CacheLayout& l, std::vector<MemoryDesc> r, const ConnectorOptions& o)
    : engine(e), layout(l), regions(std::move(r)), options(o),
      id{o.instance, l.dp_rank, l.tp_rank},
      ready(std::make_unique<internal::ReadyQueue>(o.transfer_timeout)) {}

Result<std::unique_ptr<Connector>> Connector::Create(Engine* engine, const CacheLayout& layout,
                                                     std::vector<MemoryDesc> regions,
                                                     const ConnectorOptions& options) {
  if (engine == nullptr) return Status(Code::kInvalidArgument, "no engine");
  if (Status s = layout.Validate(); !s.ok()) return s;
  if (options.instance.empty() || options.instance.size() > kMaxNameBytes) {
    return Status(Code::kInvalidArgument, "instance name must be 1.." + std::to_string(kMaxNameBytes) + " bytes");
  }
  if (regions.size() != layout.region_bytes.size()) {
    return Status(Code::kInvalidArgument, "the layout has " + std::to_string(layout.region_bytes.size()) +
                                              " regions but " + std::to_string(regions.size()) + " were given");
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].engine_key != engine->key()) {
      return Status(Code::kInvalidArgument, "region " + std::to_string(i) + " is not registered with this engine");
    }
    if (regions[i].size < layout.region_bytes[i]) {
      return Status(Code::kInvalidArgument, "region " + std::to_string(i) + " holds " +
                                                std::to_string(regions[i].size) + " bytes, the layout needs " +
                                                std::to_string(layout.region_bytes[i]));
    }
  }
  for (Duration d : {options.deferred_write_timeout, options.transfer_timeout, options.abort_timeout,
                     options.liveness_interval, options.handshake_timeout}) {
    if (d <= Duration::zero()) return Status(Code::kInvalidArgument, "connector timeouts must be positive");
  }
  if (options.checksums) {
    for (const auto& r : regions) {
      if (r.kind != MemoryKind::kHost) {
        return Status(Code::kUnsupported, "per-layer checksums need the cache in host memory");
      }
    }
  }
  auto impl = std::make_unique<Impl>(engine, layout, std::move(regions), options);
  for (const auto& r : impl->regions) impl->bases.push_back(reinterpret_cast<const std::byte*>(r.address));
  WorkerMetadata meta;
  meta.id = impl->id;
  meta.engine = engine->Describe();
  meta.layout = layout;
  meta.regions = impl->regions;
  meta.compatibility_hash = layout.CompatibilityHash();
  {
    MutexLock l(&impl->mu);
    impl->metadata = meta.Pack();
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  // The worker thread sleeps until a command, a message of the connector's topic or a timer.
  engine->WatchNotifications(kTopic, [box = impl->mailbox] { box->Wake(); });
  return std::unique_ptr<Connector>(new Connector(std::move(impl)));
}

Connector::Connector(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Connector::~Connector() {
  impl_->engine->WatchNotifications(kTopic, nullptr);
  impl_->ready.reset();  // fails the layers still waiting to be ready; their commands are queued
  {
    MutexLock l(&impl_->mailbox->mu);
    impl_->mailbox->closed = true;
    impl_->mailbox->cv.NotifyAll();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  MutexLock l(&impl_->mu);
  impl_->handshake.reset();
  if (!impl_->producing.empty() || !impl_->consuming.empty()) {
    FERRY_LOG_WARN("kv connector {} destroyed with {} producer and {} consumer requests pending",
                   impl_->id.ToString(), impl_->producing.size(), impl_->consuming.size());
  }
}

const WorkerId& Connector::id() const { return impl_->id; }

std::string Connector::Metadata() const {
  MutexLock l(&impl_->mu);
  return impl_->metadata;
}

Result<std::string> Connector::ServeHandshake(const std::string& host, uint16_t port) {
  MutexLock l(&impl_->mu);
  if (impl_->handshake) return impl_->handshake_address;
  HandshakeOptions o;
  o.host = host;
  o.port = port;
  auto server = HandshakeServer::Start(impl_->metadata, o);
  if (!server.ok()) return server.status();
  impl_->handshake = std::move(*server);
  impl_->handshake_address = impl_->handshake->address();
  return impl_->handshake_address;
}

std::string Connector::Impl::HandshakeAddress() const {
  MutexLock l(&mu);
  return handshake_address;
}

Status Connector::Impl::LearnPeer(std::string_view bytes) {
  auto meta = WorkerMetadata::Unpack(bytes);
  if (!meta.ok()) return meta.status();
  if (Status s = CheckCompatible(layout, meta->layout); !s.ok()) {
    return s.WithContext("peer " + meta->id.ToString());
  }
  if (meta->id == id) return Status(Code::kInvalidArgument, "peer " + meta->id.ToString() + " has this worker's name");
  if (Status s = engine->AddPeer(meta->engine); !s.ok()) return s;
  auto shared = std::make_shared<const WorkerMetadata>(std::move(*meta));
  {
    MutexLock l(&mu);
    peers[shared->id] = shared;
  }
  if (options.eager_connect) Post([this, shared] { Connect(*shared); });
  return {};
}

void Connector::Impl::Connect(const WorkerMetadata& peer) {
  Status s = Send(peer.engine.key, Base(MsgType::kPing, ""));
  if (!s.ok()) {
    FERRY_LOG_WARN("kv {}: connecting to {}: {}", id.ToString(), peer.id.ToString(), s.ToString());
    return;
  }
  // Sessions for every pair of regions when there are few, else region i to region i.
  const size_t local = regions.size(), remote = peer.regions.size();
  constexpr size_t kMaxEagerSessions = 4096;
  for (size_t i = 0; i < local; ++i) {
    for (size_t j = 0; j < remote; ++j) {
      if (local * remote > kMaxEagerSessions && j != i % remote) continue;
      (void)SessionFor(peer, static_cast<uint32_t>(i), static_cast<uint32_t>(j));
    }
  }
}

Status Connector::AddPeer(std::string_view metadata) { return impl_->LearnPeer(metadata); }

Status Connector::AddPeerFrom(const std::string& handshake_address) {
  auto bytes = FetchMetadata(handshake_address, impl_->options.handshake_timeout);
  if (!bytes.ok()) return bytes.status().WithContext("handshake with " + handshake_address);
  return impl_->LearnPeer(*bytes);
}

std::shared_ptr<const WorkerMetadata> Connector::Impl::PeerOf(const WorkerId& w) const {
  MutexLock l(&mu);
  auto it = peers.find(w);
  return it == peers.end() ? nullptr : it->second;
}

std::shared_ptr<const WorkerMetadata> Connector::Impl::PeerByKey(const std::string& key) const {
  MutexLock l(&mu);
  for (const auto& [w, m] : peers) {
    if (m->engine.key == key) return m;
  }
  return nullptr;
}

Result<std::vector<std::shared_ptr<const WorkerMetadata>>> Connector::Impl::InstanceRanks(std::string_view instance,
                                                                                        uint32_t dp) const {
  std::vector<std::shared_ptr<const WorkerMetadata>> out;
  MutexLock l(&mu);
  auto it = peers.lower_bound(WorkerId{std::string(instance), dp, 0});
  if (it == peers.end() || it->first.instance != instance || it->first.dp_rank != dp) {
    return Status(Code::kFailedPrecondition, "no worker of instance " + std::string(instance) + " dp" +
                                                 std::to_string(dp) + " is known (AddPeer)");
  }
  const uint32_t tp = it->second->layout.tp_size;
  for (uint32_t r = 0; r < tp; ++r) {
    auto p = peers.find(WorkerId{std::string(instance), dp, r});
    if (p == peers.end()) {
      return Status(Code::kFailedPrecondition, "worker " + WorkerId{std::string(instance), dp, r}.ToString() +
                                                   " is not known (AddPeer)");
    }
    if (p->second->layout.tp_size != tp) {
      return Status(Code::kInvalidArgument, "the workers of " + std::string(instance) + " disagree on their TP size");
    }
    out.push_back(p->second);
  }
  return out;
}

Message Connector::Impl::Base(MsgType type, const std::string& request) const {
  Message m;
  m.type = type;
  m.request = request;
  m.from = id;
  m.from_tp_size = layout.tp_size;
  return m;
}

Status Connector::Impl::Send(const std::string& engine_key, const Message& m) {
  Status s = engine->Notify(engine_key, Encode(m), kTopic);
  if (s.ok()) Count(&ConnectorStats::messages_sent);
  return s;
}

Result<Session> Connector::Impl::SessionFor(const WorkerMetadata& peer, uint32_t local_region,
                                            uint32_t remote_region) {
  auto key = std::make_tuple(peer.engine.key, local_region, remote_region);
  auto it = sessions.find(key);
  if (it != sessions.end()) return it->second;
  if (local_region >= regions.size() || remote_region >= peer.regions.size()) {
    return Status(Code::kOutOfRange, "a plan named a region that is not registered");
  }
  auto s = engine->OpenSession(regions[local_region], peer.regions[remote_region]);
  if (!s.ok()) return s.status();
  sessions.emplace(key, *s);
  return *s;
}

void Connector::Impl::Count(uint64_t ConnectorStats::*field, uint64_t n) {
  MutexLock l(&mu);
  stats.*field += n;
}

void Connector::Impl::Publish(Finished f, bool producer_side) {
  MutexLock l(&mu);
  (producer_side ? producer_ids : consumer_ids).erase(f.request);
  switch (f.outcome) {
    case Outcome::kDone: ++stats.requests_done; break;
    case Outcome::kFailed: ++stats.requests_failed; break;
    case Outcome::kAborted: ++stats.requests_aborted; break;
  }
  if (!producer_side) {
    auto it = boards.find(f.request);
    if (it != boards.end()) {
      it->second.ended = true;
      if (f.outcome != Outcome::kDone && it->second.failed.ok()) {
        it->second.failed = f.status.ok() ? Status(Code::kAborted, "request aborted") : f.status;
      }
    }
  }
  finished.push_back(std::move(f));
  finished_cv.NotifyAll();
}

void Connector::Impl::HandleNotification(const Notification& n) {
  auto m = Decode(n.message);
  if (!m.ok()) {
    Count(&ConnectorStats::messages_rejected);
    FERRY_LOG_WARN("kv {}: rejected a message from {}: {}", id.ToString(), n.from, m.status().ToString());
    return;
  }
  if (drop_on_arrival && drop_on_arrival(*m)) return;
  Count(&ConnectorStats::messages_received);
  switch (m->type) {
    case MsgType::kPing: return;
    case MsgType::kAllocation: return OnAllocation(*m, n.from);
    case MsgType::kRelease: return OnRelease(*m, n.from);
    case MsgType::kAbort: return OnConsumerAbort(*m, n.from);
    case MsgType::kCompletion: return OnCompletion(*m, n.from);
    case MsgType::kWriteFailed: return OnWriteFailed(*m, n.from);
    case MsgType::kAbortAck: return OnAbortAck(*m, n.from);
  }
  Count(&ConnectorStats::messages_rejected);
}

void Connector::Impl::Timers(TimePoint now) {
  ProducerTimers(now);
  ConsumerTimers(now);
  CheckLiveness(now);
}

// Every peer with a request outstanding is pinged each liveness_interval; one that cannot be
// reached (its process died, the link is cut) ends those requests on this side.
void Connector::Impl::CheckLiveness(TimePoint now) {
  if (now < next_liveness) return;
  next_liveness = now + options.liveness_interval;
  std::vector<std::string> keys;
  for (const auto& [rid, r] : producing) {
    for (const auto& [rank, t] : r.targets) {
      if (!t.engine_key.empty() && t.state == internal::Target::State::kOpen) keys.push_back(t.engine_key);
    }
  }
  for (const auto& [rid, r] : consuming) {
    for (const auto& [rank, s] : r.sources) {
      if (!s.settled()) keys.push_back(s.engine_key);
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  Message ping = Base(MsgType::kPing, "");
  for (const auto& key : keys) {
    Status s = engine->Notify(key, Encode(ping), kTopic);
    if (s.code() == Code::kUnavailable || s.code() == Code::kFailedPrecondition || s.code() == Code::kAborted) {
      PeerLost(key, Status(Code::kUnavailable, "peer " + key + " is unreachable: " + std::string(s.message())));
    }
  }
}

void Connector::Impl::PeerLost(const std::string& engine_key, const Status& why) {
  FERRY_LOG_WARN("kv {}: {}", id.ToString(), why.ToString());
  Count(&ConnectorStats::peers_lost);
  ProducerPeerLost(engine_key, why);
  ConsumerPeerLost(engine_key, why);
}

void Connector::Impl::Run() {
  using namespace std::chrono_literals;
  TimePoint next_sweep{};
  for (;;) {
    std::deque<internal::Command> batch;
    bool woken = false;
    {
      MutexLock l(&mailbox->mu);
      if (mailbox->closed && mailbox->commands.empty()) break;
      batch.swap(mailbox->commands);
      woken = mailbox->woken;
      mailbox->woken = false;
    }
    for (auto& c : batch) c.run();
    // Messages are taken when the engine's watcher said one arrived (and now and then, for any
    // that came before the watcher was set). Not on every pass: PopNotifications on an empty
    // inbox counts as an application thread polling, and a transport whose receiver polls
    // stops waking itself for arrivals (shm), which would leave them to this thread's tick.
    std::vector<Notification> notes;
    if (woken || Clock::now() >= next_sweep) {
      notes = engine->PopNotifications(kTopic);
      if (!woken) next_sweep = Clock::now() + 50ms;
    }
    for (const auto& n : notes) HandleNotification(n);
    const TimePoint now = Clock::now();
    Timers(now);
    if (!batch.empty() || !notes.empty()) continue;
    // Sleep until a command (a call, a transfer's end), a message (the engine's watcher) or the
    // timers' granularity: deadlines are checked every millisecond while requests are open.
    const bool busy = !producing.empty() || !consuming.empty();
    const auto wait = busy ? 1ms : 20ms;
    MutexLock l(&mailbox->mu);
    mailbox->cv.WaitUntil(&mailbox->mu, now + wait, [&]() REQUIRES(mailbox->mu) {
      return mailbox->closed || mailbox->woken || !mailbox->commands.empty();
    });
  }
}

// ---- the public calls: checked here, carried out on the worker thread ----

Status Connector::ExpectWrite(std::string_view request, std::string_view producer, uint32_t producer_dp,
                              std::span<const uint64_t> blocks, uint64_t num_tokens, uint64_t first_token) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "ExpectWrite needs write mode");
  if (impl_->options.role == Role::kProducer) return Status(Code::kFailedPrecondition, "a producer does not receive");
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  if (num_tokens > blocks.size() * uint64_t{impl_->layout.block_tokens}) {
    return Status(Code::kOutOfRange, "more tokens than the blocks hold");
  }
  auto ranks = impl_->InstanceRanks(producer, producer_dp);
  if (!ranks.ok()) return ranks.status();
  auto sources = SourcesFor(impl_->layout, *ranks);
  if (!sources.ok()) return sources.status();
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (!impl_->consumer_ids.emplace(id, true).second) {
      return Status(Code::kAlreadyExists, "request " + id + " is already pending here");
    }
  }
  impl_->Post([impl = impl_.get(), id, sources = std::move(*sources), b = std::vector<uint64_t>(blocks.begin(), blocks.end()),
               num_tokens, first_token]() mutable {
    impl->OnExpectWrite(id, std::move(sources), std::move(b), num_tokens, first_token);
  });
  return {};
}

Status Connector::StartRead(const ReadParams& params, std::span<const uint64_t> blocks, uint64_t first_token) {
  if (Status s = CheckRequestId(params.request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kRead) return Status(Code::kFailedPrecondition, "StartRead needs read mode");
  if (impl_->options.role == Role::kProducer) return Status(Code::kFailedPrecondition, "a producer does not receive");
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  auto ranks = impl_->InstanceRanks(params.producer.instance, params.producer.dp_rank);
  if (!ranks.ok() && params.producer_tp_size == 1 && !params.handshake.empty()) {
    if (Status s = AddPeerFrom(params.handshake); !s.ok()) return s;
    ranks = impl_->InstanceRanks(params.producer.instance, params.producer.dp_rank);
  }
  if (!ranks.ok()) return ranks.status();
  if ((*ranks)[0]->layout.tp_size != params.producer_tp_size) {
    return Status(Code::kInvalidArgument, "the read parameters name a TP size the producer does not have");
  }
  for (uint64_t b : params.blocks) {
    if (b >= (*ranks)[0]->layout.num_blocks) return Status(Code::kOutOfRange, "the read parameters name a block beyond the producer's cache");
  }
  auto sources = SourcesFor(impl_->layout, *ranks);
  if (!sources.ok()) return sources.status();
  {
    MutexLock l(&impl_->mu);
    if (!impl_->consumer_ids.emplace(params.request, true).second) {
      return Status(Code::kAlreadyExists, "request " + params.request + " is already pending here");
    }
    internal::LayerBoard board;
    board.landed.assign(impl_->layout.num_layers, false);
    impl_->boards[params.request] = std::move(board);
  }
  impl_->Post([impl = impl_.get(), params, ranks = std::move(*ranks), sources = std::move(*sources),
               b = std::vector<uint64_t>(blocks.begin(), blocks.end()), first_token]() mutable {
    impl->OnStartRead(std::move(params), std::move(ranks), std::move(sources), std::move(b), first_token);
  });
  return {};
}

Status Connector::WaitLayer(std::string_view request, uint32_t layer, Duration timeout) {
  if (layer >= impl_->layout.num_layers) return Status(Code::kOutOfRange, "no layer " + std::to_string(layer));
  const TimePoint until = Clock::now() + timeout;
  std::string id(request);
  MutexLock l(&impl_->mu);
  for (;;) {
    auto it = impl_->boards.find(id);
    if (it == impl_->boards.end()) return Status(Code::kNotFound, "no read of request " + id + " here");
    const auto& b = it->second;
    if (b.landed[layer]) return {};
    if (!b.failed.ok()) return b.failed;
    if (b.ended) return Status(Code::kAborted, "request " + id + " ended");
    if (!impl_->finished_cv.WaitUntil(&impl_->mu, until)) {
      auto again = impl_->boards.find(id);
      if (again != impl_->boards.end() && again->second.landed[layer]) return {};
      return Status(Code::kDeadlineExceeded, "layer " + std::to_string(layer) + " of " + id + " has not landed");
    }
  }
}

Status Connector::SaveLayer(std::string_view request, uint32_t layer, std::span<const uint64_t> blocks,
                            ReadyFn ready) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "SaveLayer needs write mode");
  if (impl_->options.role == Role::kConsumer) return Status(Code::kFailedPrecondition, "a consumer does not send");
  if (layer >= impl_->layout.num_layers) return Status(Code::kOutOfRange, "no layer " + std::to_string(layer));
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    impl_->producer_ids.emplace(id, true);
  }
  std::vector<uint64_t> b(blocks.begin(), blocks.end());
  if (!ready) {
    impl_->Post([impl = impl_.get(), id, layer, b = std::move(b)]() mutable {
      impl->OnSaved(id, layer, std::move(b), {}, false);
    });
    return {};
  }
  // Counted now, so that a Seal() right after sees it even while its data is not ready.
  impl_->Post([impl = impl_.get(), id]() { impl->OnSaveCounted(id); });
  std::weak_ptr<internal::Mailbox> box = impl_->mailbox;
  impl_->ready->Push(std::move(ready), [box, impl = impl_.get(), id, layer, b = std::move(b)](Status s) mutable {
    auto m = box.lock();
    if (!m) return;
    m->Push(internal::Command{[impl, id, layer, b = std::move(b), s = std::move(s)]() mutable {
      impl->OnSaved(id, layer, std::move(b), std::move(s), true);
    }});
  });
  return {};
}

Status Connector::Seal(std::string_view request, uint32_t layers_saved) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kWrite) return Status(Code::kFailedPrecondition, "Seal needs write mode");
  if (layers_saved > impl_->layout.num_layers) return Status(Code::kOutOfRange, "more layers than the model has");
  std::string id(request);
  impl_->Post([impl = impl_.get(), id, layers_saved]() { impl->OnSeal(id, layers_saved); });
  return {};
}

Result<ReadParams> Connector::HoldForRead(std::string_view request, std::span<const uint64_t> blocks,
                                          uint64_t num_tokens) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  if (impl_->options.mode != Mode::kRead) return Status(Code::kFailedPrecondition, "HoldForRead needs read mode");
  if (impl_->options.role == Role::kConsumer) return Status(Code::kFailedPrecondition, "a consumer does not send");
  if (Status s = CheckBlocks(impl_->layout, blocks); !s.ok()) return s;
  if (num_tokens > blocks.size() * uint64_t{impl_->layout.block_tokens}) {
    return Status(Code::kOutOfRange, "more tokens than the blocks hold");
  }
  std::string id(request);
  {
    MutexLock l(&impl_->mu);
    if (!impl_->producer_ids.emplace(id, true).second) {
      return Status(Code::kAlreadyExists, "request " + id + " is already pending here");
    }
  }
  ReadParams p;
  p.request = id;
  p.producer = impl_->id;
  p.producer_tp_size = impl_->layout.tp_size;
  p.handshake = impl_->HandshakeAddress();
  p.blocks.assign(blocks.begin(), blocks.end());
  p.num_tokens = num_tokens;
  impl_->Post([impl = impl_.get(), id, b = p.blocks, num_tokens]() mutable { impl->OnHold(id, std::move(b), num_tokens); });
  return p;
}

Status Connector::Abort(std::string_view request) {
  if (Status s = CheckRequestId(request); !s.ok()) return s;
  std::string id(request);
  bool producer = false, consumer = false;
  {
    MutexLock l(&impl_->mu);
    producer = impl_->producer_ids.count(id) > 0;
    consumer = impl_->consumer_ids.count(id) > 0;
  }
  if (!producer && !consumer) return Status(Code::kNotFound, "request " + id + " is not pending here");
  impl_->Post([impl = impl_.get(), id, producer, consumer]() {
    if (producer) impl->OnProducerAbort(id);
    if (consumer) impl->OnConsumerAbortLocal(id);
  });
  return {};
}

std::vector<Finished> Connector::PopFinished() {
  MutexLock l(&impl_->mu);
  std::vector<Finished> out(std::make_move_iterator(impl_->finished.begin()),
                            std::make_move_iterator(impl_->finished.end()));
  impl_->finished.clear();
  for (const auto& f : out) {
    if (!f.producer) impl_->boards.erase(f.request);
  }
  return out;
}

std::vector<Finished> Connector::WaitFinished(Duration timeout) {
  {
    MutexLock l(&impl_->mu);
    impl_->finished_cv.WaitUntil(&impl_->mu, Clock::now() + timeout,
                                 [&]() REQUIRES(impl_->mu) { return !impl_->finished.empty(); });
  }
  return PopFinished();
}

size_t Connector::pending() const {
  MutexLock l(&impl_->mu);
  return impl_->producer_ids.size() + impl_->consumer_ids.size();
}

ConnectorStats Connector::stats() const {
  MutexLock l(&impl_->mu);
  return impl_->stats;
}

}  // namespace ferry::kv
