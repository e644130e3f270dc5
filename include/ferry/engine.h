// Engine, Session and Transfer: ferry's transfer engine (the role of MoRI-IO's IOEngine).
//
// An Engine owns the transports usable in this process, a registry of local memory regions
// and of remote peers. A Session is a route from one local region to one remote region through
// the fastest transport both sides can use; it posts one-sided reads and writes, single or
// batched, each returning a Transfer handle that completes asynchronously. Every transfer has a
// deadline: no Wait() can block forever.
//
// Thread safety: Engine, Session and Transfer are safe to use from many threads at once.
// Sessions and transfers keep what they need alive; they fail cleanly (kAborted) once their
// engine is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/descriptors.h"
#include "ferry/metrics.h"
#include "ferry/options.h"
#include "ferry/status.h"
#include "ferry/system.h"
#include "ferry/types.h"

namespace ferry {

namespace internal {
class EngineCore;
class SessionCore;
class TransferState;
struct TransferAccess;
}  // namespace internal

class Transfer {
 public:
  Transfer() = default;  // a finished, failed transfer (kFailedPrecondition)

  // True once the transfer finished (successfully or not). Never blocks.
  bool Test() const;
  // Blocks until finished or the transfer's deadline passes; returns status(). A GPU copy (it
  // completes through a CUDA event) is polled without sleeping for EngineOptions::wait_spin,
  // then between sleeps; other transfers are waited for on a condition variable.
  Status Wait() const;
  // Blocks at most `timeout`; returns kInProgress if still running then.
  Status WaitFor(Duration timeout) const;
  // kInProgress while running, then the final status.
  Status status() const;
  uint64_t bytes() const;
  TransferPath path() const;
  TransferId id() const;

 private:
  friend class Session;
  friend class internal::SessionCore;
  friend struct internal::TransferAccess;
  explicit Transfer(std::shared_ptr<internal::TransferState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::TransferState> state_;
};

// Waits on many transfers at once, blocking on a condition variable, each wait bounded by the
// earliest deadline among the transfers still running. Among them GPU copies are polled as
// Transfer::Wait polls one (EngineOptions::wait_spin, then between sleeps).
//
// WaitAll: OK once every transfer finished OK; the first error (in the order the transfers
// finished) as soon as one fails, without waiting for the rest. A transfer whose deadline
// passes fails with kDeadlineExceeded. An empty list is OK.
Status WaitAll(std::span<const Transfer> transfers);
// The same, giving up after `timeout` with kInProgress (the transfers keep running).
Status WaitAll(std::span<const Transfer> transfers, Duration timeout);
// WaitAny: the index of a finished transfer (successful or not: see its status()); the
// lowest index when several have finished. kDeadlineExceeded when the earliest deadline among
// them passes with none finished (that transfer then has failed with kDeadlineExceeded, so a
// later call returns it). kInvalidArgument for an empty list.
Result<size_t> WaitAny(std::span<const Transfer> transfers);
// The same, giving up after `timeout` with kInProgress.
Result<size_t> WaitAny(std::span<const Transfer> transfers, Duration timeout);

struct TransferOptions {
  // Overrides EngineOptions::default_deadline for this transfer. Must be positive: a zero or
  // negative one fails the transfer with kInvalidArgument before any byte moves.
  std::optional<Duration> deadline;
  // Id reported by Transfer::id(); default = Engine::AllocateTransferId().
  std::optional<TransferId> id;
  // Writes only: a notification delivered to the remote engine after all of this batch's data
  // is in place at the target, and after every write this session posted before it has
  // finished (layer-by-layer pushes may complete out of order). If one of those earlier writes
  // fails, the notification is not sent and this transfer fails with that write's error.
  // At most EngineOptions::max_notification_bytes (kInvalidArgument beyond).
  std::optional<std::string> notification;
  // The topic the notification is delivered on (Engine::PopNotifications(topic)); "" is the
  // application's. At most kMaxTopicBytes (kInvalidArgument beyond).
  std::string notification_topic;
  // Earlier transfers, of any session of this engine (e.g. one session per KV layer to the same
  // peer), that this one is ordered after: it finishes, and its notification leaves, only once
  // each of them finished OK. If one failed, the notification is not sent and this transfer
  // fails with that one's error. Its own data is posted at once, not held back. With an empty
  // batch (or Engine::NotifyAfter) it is a notification that follows them. An empty handle
  // here fails the transfer with kInvalidArgument.
  std::vector<Transfer> after;
  // Runs exactly once with the final status, on the engine's completion thread (one per
  // engine, running callbacks one at a time, never with a lock of the engine or of a transport
  // held, so it may post transfers or notify), or at once on the calling thread when the
  // transfer has already finished when posted (e.g. refused arguments). A transfer nobody waits
  // on still finishes by its deadline, and the callback runs then (kDeadlineExceeded).
  // Callbacks of transfers that finish after the engine is destroyed run on the thread that
  // finishes them (kAborted). Keep it short: a slow callback delays the ones after it.
  std::function<void(const Status&)> on_complete;
};

class Session {
 public:
  Session() = default;

  // One-sided write of local[local_offset, +bytes) to remote[remote_offset, +bytes), and the
  // reverse for Read. Ops outside either region fail with kOutOfRange and move nothing.
  Transfer Write(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                 const TransferOptions& options = {}) const;
  Transfer Read(uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                const TransferOptions& options = {}) const;
  // A batch is one transfer; an empty batch succeeds at once. If any op is out of range the
  // whole batch fails with kOutOfRange before any byte moves.
  Transfer WriteBatch(std::span<const TransferOp> ops, const TransferOptions& options = {}) const;
  Transfer ReadBatch(std::span<const TransferOp> ops, const TransferOptions& options = {}) const;
  // The ops are copied once, before they are checked; the transport moves that copy, so the
  // caller's array may change (or be freed) as soon as the call returns, and a change made by
  // another thread during the call cannot move bytes that were not checked.
  Transfer Post(Op op, std::span<const TransferOp> ops, const TransferOptions& options = {}) const;
  // The same, taking the caller's vector instead of copying it.
  Transfer Post(Op op, std::vector<TransferOp>&& ops, const TransferOptions& options = {}) const;

  const MemoryDesc& local() const;
  const MemoryDesc& remote() const;
  TransferPath path() const;
  bool valid() const { return core_ != nullptr; }
  // False once the connection under the session failed (the peer went away, or fenced this
  // engine): its transfers fail at once. Open a new session to the same regions; the engine
  // connects anew.
  bool connected() const;

 private:
  friend class Engine;
  explicit Session(std::shared_ptr<internal::SessionCore> core) : core_(std::move(core)) {}
  std::shared_ptr<internal::SessionCore> core_;
};

// How a region is registered (Engine::RegisterMemory).
struct RegionOptions {
  // Engine keys of the peers that may reach the region; empty = every peer (the default).
  // This engine always reaches its own region. Any other engine is refused before any byte
  // moves: its OpenSession to the region fails with kPermissionDenied (a message naming the
  // region), and a peer that skips that check has each request refused the same way. Each
  // refusal is counted (EngineStats::access_denied, ferry_access_denied_total) and logged once
  // per (peer, region). Who a peer is comes from its connection: with EngineOptions::secret
  // the key it authenticated with (the proofs of the ucx door and of shm cover both keys);
  // without a secret a key is only a claim, and access lists stop mistakes, not attackers
  // (a warning is logged once). Over `cuda_ipc`, whose IPC handles travel in descriptors
  // that any process of the host could open, a restricted GPU region is not exported at all:
  // peers reach it through `ucx` (staged), which checks every request. Over `ucx` a
  // restricted region's descriptor carries no RDMA remote key: peers reach it through active
  // messages, each checked. Over `shm` the region's memory file is handed to allowed peers
  // only; put a restricted region in a shared buffer of its own (AllocateSharedHost), as a
  // peer that holds a buffer's file could map all of it.
  std::vector<std::string> allowed_peers;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::string& key() const;
  // This engine's descriptor, to hand to peers.
  EngineDesc Describe() const;
  // Names of the transports this engine started.
  std::vector<std::string> transports() const;
  // The same transports (cheapest first), with what each carries.
  std::vector<TransportInfo> transport_info() const;

  // Registers [ptr, ptr + bytes) of host memory or of CUDA device `device`.
  // REQUIRES: the memory stays valid until DeregisterMemory() returns OK (a region still in
  // use when its deadline passes is reported with kDeadlineExceeded and must not be freed).
  Result<MemoryDesc> RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind = MemoryKind::kHost,
                                    int device = -1);
  // The same, with `options` (an access list). kInvalidArgument for an empty or overlong
  // (over 256 bytes) key or more than 1024 keys in allowed_peers.
  Result<MemoryDesc> RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind, int device,
                                    const RegionOptions& options);
  // Makes every later transfer on the region fail with kFailedPrecondition, then waits for the
  // transfers still using it (EngineOptions::deregister_timeout). For GPU memory
  // reached by other processes (cuda_ipc), that includes their copies into it: no peer copy
  // runs or starts once this returns (a peer that did not drain in time is logged).
  // kDeadlineExceeded when a transfer still uses the region then (e.g. one waiting on a
  // stopped peer): the region stays registered, retiring (no new session or transfer on it),
  // and a later call waits again and frees it; the memory must stay valid until one returns OK.
  Status DeregisterMemory(RegionId region);
  Status DeregisterMemory(const MemoryDesc& desc) { return DeregisterMemory(desc.region); }

  // Peers: descriptors of remote engines. Adding a peer with a known key replaces it.
  Status AddPeer(const EngineDesc& peer);
  Status RemovePeer(std::string_view key);
  // Ends every connection that peer `key` made to this engine, so that nothing it sent before
  // the call lands in this engine's memory afterwards: writes still queued in a link that was
  // cut are refused when the link comes back, and writes already landing are waited for, up to
  // `timeout`. The peer's later requests come over new connections (its sessions opened before
  // report connected() false). What a consumer does before it hands blocks back that a silent
  // producer may still be writing. kDeadlineExceeded when writes were still landing at
  // `timeout`: the connections are dropped already; call again later. Over shm, cuda_ipc and
  // local a peer's writes are copies it makes itself, each checked against its deadline first:
  // nothing is queued here to refuse, and those transports return OK.
  Status FencePeer(std::string_view key, Duration timeout);

  // A route from a local region of this engine to a region of a peer (or of this engine).
  Result<Session> OpenSession(const MemoryDesc& local, const MemoryDesc& remote);

  TransferId AllocateTransferId();

  // Sends a notification to a peer (or to this engine), ordered after the data of the writes
  // to that peer that completed before the call, and after the earlier notifications of this
  // thread. One-way across processes (`ucx`): OK means it was sent, not that the receiver
  // holds it (only the first on a new connection waits for the peer's answer, up to
  // UcxOptions::connect_timeout). A full backlog at the receiver drops it there and counts it
  // in the receiver's stats().dropped_notifications; a peer that died fails a later call
  // (kUnavailable). Between processes of one host (`shm`) it is one-way too: OK means it is in
  // the receiver's notification ring in shared memory (the first on a new connection waits for
  // the ring, up to ShmOptions::call_timeout); a full ring (a receiver that does not keep up)
  // is reported here with kResourceExhausted, and a message more than 68 bytes (the room the
  // topic frame may take) over the receiver's max_notification_bytes with kInvalidArgument,
  // neither counted at the receiver; one over the receiver's limit by 68 bytes or less reaches
  // it and is dropped and counted there. Within
  // a process (`local`) the receiver holds it on return, and a full backlog is reported here
  // (kResourceExhausted) as well as counted. To know that the receiver holds a notification,
  // send it with a write batch (TransferOptions::notification): the batch completes only then.
  //
  // `topic` sorts notifications at the receiver: PopNotifications(topic) returns only that
  // topic's, so a subsystem (e.g. the KV connector, on its own topic) never sees the
  // application's messages, nor they its. At most kMaxTopicBytes (kInvalidArgument beyond).
  // The message is at most EngineOptions::max_notification_bytes whatever the topic (the
  // topic travels in a small frame beside it; "" travels unframed, as before topics).
  Status Notify(std::string_view peer_key, std::string_view message, std::string_view topic = {});
  // A notification to a peer that leaves only once each transfer of `after` (of any sessions
  // of this engine) finished OK, i.e. after their data is in place at their targets: e.g. "the
  // KV cache of request 7 is complete" after the writes of every layer's session. The returned
  // transfer finishes when the notification was delivered as Notify() would (or fails: if one
  // of `after` failed, with that one's error and nothing is sent). `options`: deadline, id,
  // notification_topic and on_complete apply; `notification` and `after` must be unset
  // (kInvalidArgument). Unknown peers fail the transfer with kFailedPrecondition.
  Transfer NotifyAfter(std::string_view peer_key, std::string_view message,
                       std::span<const Transfer> after, const TransferOptions& options = {});
  // Takes every notification of `topic` received so far, in arrival order (the other topics'
  // stay; the backlog bounds count every topic together). On an empty inbox it lets
  // the transports make progress once from this thread if they can without waiting (`ucx`:
  // a try-lock of the UCX worker, never waiting behind its progress thread; `shm`: drains the
  // notification rings, one load per ring when they are empty), so that a
  // polling thread receives without a hand-off between threads. A thread may poll it in a
  // loop, yielding between calls where cores are few (the progress threads need them too).
  std::vector<Notification> PopNotifications(std::string_view topic = {});
  // Runs `on_arrival` each time a notification of `topic` arrives (after it is in the inbox),
  // so that a thread waiting for them can sleep instead of polling: keep it short (wake that
  // thread), since it runs on the receiving transport's thread, or on a thread inside
  // PopNotifications. One per topic; a later call replaces it, an empty function removes it (a
  // call already under way may still finish after that, so hold what it touches by
  // shared_ptr). Arrivals do not wait for anyone to poll: every transport takes them in on its
  // own threads.
  void WatchNotifications(std::string_view topic, std::function<void()> on_arrival);

  EngineStats stats() const;
  // Counters, latency histograms and gauges of this engine's transfers and notifications
  // (ferry/metrics.h; RenderPrometheus for the text form). Cheap enough to scrape each second.
  MetricsSnapshot Metrics() const;
  // Every transfer still running, oldest first (RenderInFlight prints them).
  std::vector<InFlightTransfer> InFlight() const;
  // The port of the GET /metrics endpoint (EngineOptions::metrics_port); 0 when it is off.
  int MetricsPort() const;

 private:
  explicit Engine(std::shared_ptr<internal::EngineCore> core);
  std::shared_ptr<internal::EngineCore> core_;
};

// The library's version, "MAJOR.MINOR.PATCH".
std::string_view Version();

}  // namespace ferry
