// The Connector's creation, peers, messages and worker thread. The public calls on requests are
// in connector_calls.cc, the request state machines in connector_producer.cc and
// connector_consumer.cc.
#include <algorithm>
#include <thread>
#include <utility>

#include "base/log.h"
#include "base/spin.h"
#include "base/thread_pool.h"
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

Status ReadyQueue::Start() {
  FERRY_ASSIGN_OR_RETURN(thread_, StartThread("kv-ready", [this] { Run(); }));
  return {};
}

void ReadyQueue::Push(ReadyFn ready, Done done) {
  MutexLock l(&mu_);
  items_.emplace_back(std::move(ready), std::move(done));
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
  std::unique_ptr<Checksummer> checksummer;  // host memory hashed on the CPU, GPU memory on the GPU
  if (options.checksums) {
    FERRY_ASSIGN_OR_RETURN(checksummer, Checksummer::Create(layout, regions));
  }
  auto impl = std::make_unique<Impl>(engine, layout, std::move(regions), options);
  impl->checksummer = std::move(checksummer);
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
  FERRY_RETURN_IF_ERROR(impl->ready->Start());
  FERRY_ASSIGN_OR_RETURN(impl->thread, StartThread("kv-connector", [raw] { raw->Run(); }));
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
  std::string replaced;  // the engine this worker had before, if it came back as another
  {
    MutexLock l(&mu);
    auto it = peers.find(shared->id);
    if (it != peers.end() && it->second->engine.key != shared->engine.key) replaced = it->second->engine.key;
    peers[shared->id] = shared;
  }
  if (!replaced.empty()) Post([this, replaced] { DropSessionsOf(replaced); });
  if (options.eager_connect) Post([this, shared] { Connect(*shared); });
  return {};
}

void Connector::Impl::DropSessionsOf(const std::string& engine_key) {
  // A worker that came back as another engine (its process restarted): the sessions to the
  // engine it had are dropped unless a worker names that engine again by now (metadata that
  // flapped back). A session holds its connection, and over shm the connection a ring; the
  // engine drops its own cached connection once the transport found it dead. Requests of the
  // old engine are left to end as they would have (their peer's liveness, their deadlines):
  // the engine's peer entry and any connection the transport has not yet found dead stay, so
  // nothing is closed here that the transport did not close itself (UCX 1.13 aborted in a soak
  // that closed endpoints of dead peers: bench/results/soak.md).
  if (PeerByKey(engine_key) != nullptr) return;
  for (auto it = sessions.begin(); it != sessions.end();)
    it = std::get<0>(it->first) == engine_key ? sessions.erase(it) : std::next(it);
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
  if (it != sessions.end()) {
    if (it->second.connected()) return it->second;
    sessions.erase(it);  // its connection failed (the peer left or fenced this engine): anew
  }
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

void Connector::Impl::Publish(Finished f, bool producer_side, bool remember_ended) {
  MutexLock l(&mu);
  (producer_side ? producer_ids : consumer_ids).erase(f.request);
  if (remember_ended) ended_ids.insert(f.request);
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
  f.at = std::chrono::steady_clock::now();
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
    case MsgType::kReleaseAck: return OnReleaseAck(*m, n.from);
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
  TimePoint next_timers{};
  uint64_t idle_passes = 0;
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
    const bool busy = !producing.empty() || !consuming.empty();
    const bool polling = busy && options.busy_poll;
    // Messages are taken when the engine's watcher said one arrived (and now and then, for any
    // that came before the watcher was set). Not on every pass: PopNotifications on an empty
    // inbox counts as an application thread polling, and a transport whose receiver polls
    // stops waking itself for arrivals (shm), which would leave them to this thread's tick.
    // Busy polling does poll on every pass: this thread then receives them itself, with no
    // receiver thread to wake.
    std::vector<Notification> notes;
    TimePoint now = Clock::now();
    if (polling || woken || now >= next_sweep) {
      notes = engine->PopNotifications(kTopic);
      if (!woken && !polling) next_sweep = now + 50ms;
    }
    if (!notes.empty()) {
      // Calls queued while the messages were taken run first: a call that returned before a peer
      // reacted to it (HoldForRead, then the consumer's read and release) is in the mailbox by
      // the time that reaction's message is popped, and must not be overtaken by it.
      std::deque<internal::Command> late;
      {
        MutexLock l(&mailbox->mu);
        late.swap(mailbox->commands);
      }
      for (auto& c : late) c.run();
    }
    for (const auto& n : notes) HandleNotification(n);
    if (!notes.empty()) now = Clock::now();
    // Deadlines are checked every millisecond while requests are open.
    if (now >= next_timers) {
      Timers(now);
      next_timers = now + 1ms;
    }
    if (!batch.empty() || !notes.empty()) continue;
    if (polling) {
      // Now and then the core is offered to the scheduler: where cores are few, the transports'
      // and the application's threads need it (sched_yield returns at once on an idle core).
      if (++idle_passes % 64 == 0) {
        std::this_thread::yield();
      } else {
        CpuRelax();
      }
      continue;
    }
    // Sleep until a command (a call, a transfer's end), a message (the engine's watcher) or the
    // timers' granularity.
    const auto wait = busy ? 1ms : 20ms;
    MutexLock l(&mailbox->mu);
    mailbox->cv.WaitUntil(&mailbox->mu, now + wait, [&]() REQUIRES(mailbox->mu) {
      return mailbox->closed || mailbox->woken || !mailbox->commands.empty();
    });
  }
}

}  // namespace ferry::kv
