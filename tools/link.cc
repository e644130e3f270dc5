#include "link.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "buffers.h"
#include "observe.h"
#include "side_channel.h"

namespace ferry::tools {
namespace {

class InProcessLink final : public Link {
 public:
  const Session& session() const override { return session_; }
  uint64_t bytes() const override { return bytes_; }
  std::string Describe() const override {
    return fmt::format("in-process, {0} -> {0}, {1}, copy threads {2}", MemoryKindName(kind_),
                       session_.path().ToString(),
                       copy_threads_ == 0 ? "auto" : std::to_string(copy_threads_));
  }

  ~InProcessLink() override {
    // Deregistering waits for transfers still using the buffers; a buffer that a late copy may
    // still touch is leaked rather than freed. Then the engines go, before the buffers.
    session_ = Session();
    if (local_desc_.size != 0) DeregisterAndFree(*local_engine_, local_desc_, local_buffer_);
    if (remote_desc_.size != 0) DeregisterAndFree(*remote_engine_, remote_desc_, remote_buffer_);
  }

  static Result<std::unique_ptr<Link>> Make(const InProcessLinkOptions& o) {
    std::unique_ptr<InProcessLink> link(new InProcessLink());
    link->kind_ = o.kind;
    link->copy_threads_ = o.engine.copy_threads;
    link->bytes_ = o.bytes;
    int device = o.kind == MemoryKind::kCuda ? o.device : -1;
    FERRY_ASSIGN_OR_RETURN(link->local_buffer_, Buffer::Allocate(o.kind, device, o.bytes, o.alloc));
    FERRY_ASSIGN_OR_RETURN(link->remote_buffer_, Buffer::Allocate(o.kind, device, o.bytes, o.alloc));

    EngineOptions local_options = o.engine;
    local_options.key = "bench-initiator";
    EngineOptions remote_options = o.engine;
    remote_options.key = "bench-target";
    remote_options.metrics_port = 0;  // one endpoint a process: the initiator's (a fixed port fits one)
    FERRY_ASSIGN_OR_RETURN(link->local_engine_, Engine::Create(local_options));
    FERRY_ASSIGN_OR_RETURN(link->remote_engine_, Engine::Create(remote_options));
    FERRY_RETURN_IF_ERROR(link->local_engine_->AddPeer(link->remote_engine_->Describe()));

    FERRY_ASSIGN_OR_RETURN(
        link->local_desc_,
        link->local_engine_->RegisterMemory(link->local_buffer_->data(), o.bytes, o.kind, device));
    FERRY_ASSIGN_OR_RETURN(link->remote_desc_,
                           link->remote_engine_->RegisterMemory(link->remote_buffer_->data(),
                                                                o.bytes, o.kind, device));
    FERRY_ASSIGN_OR_RETURN(link->session_,
                           link->local_engine_->OpenSession(link->local_desc_, link->remote_desc_));
    return std::unique_ptr<Link>(std::move(link));
  }

 private:
  InProcessLink() = default;

  MemoryKind kind_ = MemoryKind::kHost;
  int copy_threads_ = 0;
  uint64_t bytes_ = 0;
  std::unique_ptr<Buffer> local_buffer_;
  std::unique_ptr<Buffer> remote_buffer_;
  std::unique_ptr<Engine> local_engine_;
  std::unique_ptr<Engine> remote_engine_;
  MemoryDesc local_desc_;
  MemoryDesc remote_desc_;
  Session session_;
};

constexpr std::string_view kHello = "ferry-bench/1";

// How a polling loop waits between rounds, `since` the start of its wait. Yielding: on a
// machine with few cores, the progress threads that carry the notifications need the core
// this thread would otherwise keep for a whole time slice (bench/results/ucx_two_process.md).
// Where the polling thread receives by itself it spins first, as ucx_perftest does, then
// yields:
// - kSpinShared with UcxOptions::Progress::kShared (the thread drives the UCX worker), so that
//   a thread that must run (UCX's async thread, another process) gets the core within a round
//   trip rather than at the next scheduler tick. (50 us of spinning made some runs 70 us
//   one-way here: a kernel thread that delivers loopback TCP packets waited for the yield.)
// - kSpinShm over the shm transport (the thread drains the notification rings). When the
//   scheduler keeps both bench processes on one of two cores, each spins out its turn while
//   the other waits: 12-14 us one-way with 10 us of spinning, 1 ms with 1 ms of it (instead
//   of 0.4-0.9 us when they run on two cores; bench/results/shm_two_process.md).
enum class Spin { kNone, kShared, kShm };

// Keeps the calling thread on `cpu` (none when negative) until it goes out of scope. On two
// cores the scheduler may otherwise run both bench processes' polling threads on one of them,
// each spinning out its turn while the other waits (bench/results/shm_two_process.md).
class PinThread {
 public:
  explicit PinThread(int cpu) {
    if (cpu < 0 || pthread_getaffinity_np(pthread_self(), sizeof(before_), &before_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned_ = pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
  }
  ~PinThread() {
    if (pinned_) (void)pthread_setaffinity_np(pthread_self(), sizeof(before_), &before_);
  }
  PinThread(const PinThread&) = delete;
  PinThread& operator=(const PinThread&) = delete;

 private:
  cpu_set_t before_{};
  bool pinned_ = false;
};
constexpr auto kSpinShared = std::chrono::microseconds(10);
constexpr auto kSpinShm = std::chrono::microseconds(10);
void Pause(Spin spin, std::chrono::steady_clock::time_point since) {
  const auto waited = std::chrono::steady_clock::now() - since;
  if ((spin == Spin::kShared && waited < kSpinShared) || (spin == Spin::kShm && waited < kSpinShm)) return;
  std::this_thread::yield();
}
Spin SpinFor(const EngineOptions& options, bool shm) {
  if (shm) return Spin::kShm;
  return options.ucx.progress == UcxOptions::Progress::kShared ? Spin::kShared : Spin::kNone;
}

class RemoteLink final : public Link {
 public:
  const Session& session() const override { return session_; }
  uint64_t bytes() const override { return bytes_; }
  std::string Describe() const override {
    return fmt::format("two processes, {0} -> {0} of {1}, {2}", MemoryKindName(kind_), peer_,
                       session_.path().ToString());
  }
  ~RemoteLink() override {
    session_ = Session();
    if (channel_) (void)channel_->Send("done");
    if (local_desc_.size != 0) DeregisterAndFree(*engine_, local_desc_, buffer_);
  }

  static Result<std::unique_ptr<Link>> Make(const RemoteLinkOptions& o) {
    std::unique_ptr<RemoteLink> link(new RemoteLink());
    link->kind_ = o.kind;
    link->bytes_ = o.bytes;
    link->options_ = o.engine;
    link->ping_cpu_ = o.ping_cpu;
    FERRY_ASSIGN_OR_RETURN(link->channel_, SideChannel::Dial(o.peer, o.connect_timeout));
    link->peer_ = o.peer;
    FERRY_ASSIGN_OR_RETURN(std::string hello, link->channel_->Receive(o.connect_timeout));
    if (hello != kHello)
      return Status(Code::kFailedPrecondition, o.peer + " is not a `ferry bench --listen` of this version");
    FERRY_ASSIGN_OR_RETURN(std::string engine_bytes, link->channel_->Receive(o.connect_timeout));
    FERRY_ASSIGN_OR_RETURN(std::string memory_bytes, link->channel_->Receive(o.connect_timeout));
    FERRY_ASSIGN_OR_RETURN(EngineDesc peer, EngineDesc::Unpack(engine_bytes));
    FERRY_ASSIGN_OR_RETURN(MemoryDesc remote, MemoryDesc::Unpack(memory_bytes));
    if (remote.size < o.bytes)
      return Status(Code::kFailedPrecondition,
                    fmt::format("the listener serves {} bytes; this grid needs {}", remote.size, o.bytes));
    int device = o.kind == MemoryKind::kCuda ? o.device : -1;
    FERRY_ASSIGN_OR_RETURN(link->buffer_, Buffer::Allocate(o.kind, device, o.bytes, o.alloc));
    FERRY_ASSIGN_OR_RETURN(link->engine_, Engine::Create(o.engine));
    FERRY_ASSIGN_OR_RETURN(link->local_desc_,
                           link->engine_->RegisterMemory(link->buffer_->data(), o.bytes, o.kind, device));
    FERRY_RETURN_IF_ERROR(link->engine_->AddPeer(peer));
    FERRY_ASSIGN_OR_RETURN(link->session_, link->engine_->OpenSession(link->local_desc_, remote));
    // The listener answers this engine's notifications: it needs to know it.
    FERRY_RETURN_IF_ERROR(link->channel_->Send(link->engine_->Describe().Pack()));
    link->peer_key_ = peer.key;
    return std::unique_ptr<Link>(std::move(link));
  }

  Result<std::vector<double>> NotificationLatencyUs(int count) const override {
    using Clock = std::chrono::steady_clock;
    std::vector<double> one_way_us;
    FERRY_RETURN_IF_ERROR(channel_->Send("pings"));  // the listener answers until the next message
    const Spin spin = SpinFor(options_, session_.path().transport == "shm");
    PinThread pin(ping_cpu_);
    for (int i = 0; i < count; ++i) {
      const std::string ping = "ping " + std::to_string(i);
      const auto start = Clock::now();
      FERRY_RETURN_IF_ERROR(engine_->Notify(peer_key_, ping));
      const auto until = start + std::chrono::seconds(5);
      bool answered = false;
      while (!answered) {
        for (const Notification& n : engine_->PopNotifications()) answered = answered || n.message == ping;
        if (!answered && Clock::now() > until)
          return Status(Code::kDeadlineExceeded, "the listener did not answer '" + ping + "'");
        if (!answered) Pause(spin, start);
      }
      one_way_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 2);
    }
    FERRY_RETURN_IF_ERROR(channel_->Send("pause"));
    return one_way_us;
  }

 private:
  RemoteLink() = default;
  MemoryKind kind_ = MemoryKind::kHost;
  uint64_t bytes_ = 0;
  std::string peer_;
  std::string peer_key_;
  EngineOptions options_;
  int ping_cpu_ = -1;
  std::unique_ptr<SideChannel> channel_;
  std::unique_ptr<Buffer> buffer_;  // freed after the engine
  std::unique_ptr<Engine> engine_;
  MemoryDesc local_desc_;
  Session session_;
};

}  // namespace

Result<std::unique_ptr<Link>> MakeInProcessLink(const InProcessLinkOptions& options) {
  return InProcessLink::Make(options);
}

Result<std::unique_ptr<Link>> MakeRemoteLink(const RemoteLinkOptions& options) {
  return RemoteLink::Make(options);
}

Status ServeBench(const ServeOptions& o, const std::function<void(const std::string&)>& on_listening) {
  int device = o.kind == MemoryKind::kCuda ? o.device : -1;
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, Buffer::Allocate(o.kind, device, o.bytes, o.alloc));
  EngineOptions engine_options = o.engine;  // the engine listens where the side channel does
  engine_options.ucx.listen_host = EngineListenHost(o.listen, engine_options.ucx.listen_host);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(engine_options));
  FERRY_ASSIGN_OR_RETURN(MemoryDesc desc, engine->RegisterMemory(buffer->data(), o.bytes, o.kind, device));
  // `kill -USR1` prints the transfers in flight (one dump a process: a refusal only says so).
  auto dump = InFlightDump::Start(engine.get());
  if (!dump.ok()) fmt::print(stderr, "ferry: no in-flight dump on SIGUSR1: {}\n", dump.status().ToString());
  if (engine->MetricsPort() != 0) {
    fmt::print(stderr, "ferry: metrics on http://127.0.0.1:{}/metrics\n", engine->MetricsPort());
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<SideListener> listener, SideListener::Listen(o.listen));
  on_listening(listener->address());
  Status result;
  {
    auto channel = listener->Accept(o.wait);
    if (!channel.ok()) {
      result = channel.status();
    } else {
      SideChannel& c = **channel;
      result = c.Send(kHello);
      if (result.ok()) result = c.Send(engine->Describe().Pack());
      if (result.ok()) result = c.Send(desc.Pack());
      auto peer_bytes = result.ok() ? c.Receive(o.wait) : Result<std::string>(result);
      if (peer_bytes.ok()) {
        auto peer = EngineDesc::Unpack(*peer_bytes);
        result = peer.ok() ? engine->AddPeer(*peer) : peer.status();
      } else {
        result = peer_bytes.status();
      }
      // Until the peer says "done" (or closes the channel when it exits). Between "pings" and
      // the next message, answer each of its notifications with the same message, spinning so
      // that the answer adds no sleep to its latency measurement.
      while (result.ok()) {
        auto msg = c.Receive(o.wait);
        if (!msg.ok()) {
          if (msg.status().code() != Code::kUnavailable) result = msg.status();
          break;
        }
        if (*msg == "done") break;
        if (*msg != "pings") continue;
        // The side channel is looked at every millisecond only: a syscall in every round of
        // the loop added to each answer's latency.
        using Clock = std::chrono::steady_clock;
        PinThread pin(o.ping_cpu);
        const auto t = engine->transports();
        const Spin spin = SpinFor(o.engine, std::find(t.begin(), t.end(), "shm") != t.end());
        auto look = Clock::now();
        auto since = Clock::now();
        for (;;) {
          for (const Notification& n : engine->PopNotifications()) {
            (void)engine->Notify(n.from, n.message);
            since = Clock::now();
          }
          if (Clock::now() >= look) {
            if (c.Readable(std::chrono::milliseconds(0))) break;
            look = Clock::now() + std::chrono::milliseconds(1);
          }
          Pause(spin, since);
        }
      }
    }
  }
  DeregisterAndFree(*engine, desc, buffer);
  return result;
}

}  // namespace ferry::tools
