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
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/descriptors.h"
#include "ferry/status.h"
#include "ferry/system.h"

namespace ferry {

namespace internal {
class EngineCore;
class SessionCore;
class TransferState;
}  // namespace internal

using Duration = std::chrono::nanoseconds;

// Settings of the `ucx` transport (the counterparts of MoRI-IO's RdmaBackendConfig). UCX's own
// UCX_* environment variables still apply underneath (e.g. UCX_TLS, UCX_NET_DEVICES).
struct UcxOptions {
  enum class Progress : uint8_t {
    kPolling,  // the progress thread spins: lowest latency, one busy core
    kEvent,    // the progress thread sleeps on the worker's event fd when idle
    // As kEvent, and while application threads poll (PopNotifications on an empty inbox
    // progresses the worker from the calling thread) and nothing is outstanding, the progress
    // thread steps back: arriving messages do not wake it, so they are handled by the polling
    // thread alone, as by one thread of ucx_perftest. When the application stops polling, the
    // thread resumes within 1 ms. For applications that poll notifications in a loop.
    kShared,
  };
  enum class Rma : uint8_t {
    kAuto,    // native RMA over RDMA verbs; active messages elsewhere (TCP, shared memory)
    kAlways,  // always put/get
    kNever,   // always active messages
  };
  // Where the engine listens for peers' connections: host (an IPv4 address) and port (0 = pick
  // a free one). EngineDesc advertises the addresses peers can dial. The default, loopback,
  // serves peers on this host only; "0.0.0.0" listens on every interface (and advertises each
  // IPv4 address), a single address on that interface alone. Until peers authenticate, anyone
  // who can reach the port and holds a region's descriptor can reach the region.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // A connection begins with ferry's handshake on the listening socket: at most
  // max_pending_handshakes are in progress (a new one drops the oldest), each must finish
  // within handshake_timeout, and at most max_connections peers' connections are served
  // (more are refused with kResourceExhausted).
  size_t max_pending_handshakes = 64;
  size_t max_connections = 512;
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5);
  // Endpoints opened to each peer; ops of a batch are striped across them.
  int lanes = 1;
  // UCX workers, each with its own progress thread (1..16). Connections to peers, and their
  // lanes, are spread over them; connections that peers open to this engine are served by
  // the first. Known problem: with more than one worker, a peer killed mid-transfer once
  // aborted the process inside UCX 1.13's async event handling (`handler->async == async` in
  // async.c during ucp_worker_progress). UCX keys its async handlers by file descriptor, and a
  // missed event queued by one worker for a socket that closed can reach the handler another
  // worker registered for the reused descriptor. Keep 1 where peers may fail.
  int workers = 1;
  // Ops posted to UCX before the progress thread lets the worker make progress.
  int post_batch = 256;
  Progress progress = Progress::kEvent;
  Rma rma = Rma::kAuto;
  // Largest piece sent as one active message; larger pieces are split.
  uint64_t max_am_bytes = 8 << 20;
  // How long a connection may take to come up before its transfers fail with kUnavailable.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(10);
};

// Settings of the `shm` transport: host memory of this host's processes, reached in buffers
// from ferry::AllocateSharedHost (ferry/shared_memory.h).
struct ShmOptions {
  // How long deregistering a region waits for the peers that map it to unmap it; a peer that
  // has not answered by then (e.g. a stopped process) is disconnected.
  std::chrono::milliseconds revoke_timeout = std::chrono::seconds(5);
  // How long a round trip to a peer (mapping its region, Engine::Notify) may take.
  std::chrono::milliseconds call_timeout = std::chrono::seconds(10);
};

// Bounds of EngineOptions' counts; values outside them fail Engine::Create (kInvalidArgument).
inline constexpr int kMaxCopyThreads = 1024;
inline constexpr size_t kMaxPendingNotifications = size_t{1} << 24;
inline constexpr size_t kMaxPendingNotificationBytes = size_t{1} << 40;

struct EngineOptions {
  // Unique key of this engine; empty = "<hostname>:<pid>:<random>".
  std::string key;
  // Deadline of a transfer that does not set its own.
  Duration default_deadline = std::chrono::seconds(30);
  // How long DeregisterMemory waits for the transfers still using a region (a transfer that
  // passed its deadline may still be copying); unset: default_deadline, and at least 10 s.
  std::optional<Duration> deregister_timeout;
  // Threads that copy host memory for large batches (the local and shm transports, each its
  // own); 0 = one per core, at most 8; at most kMaxCopyThreads. Batches under
  // `parallel_copy_bytes` are copied on the posting thread.
  int copy_threads = 0;
  uint64_t parallel_copy_bytes = 4 << 20;
  // Page-lock host regions at registration when a CUDA device is present, so GPU copies and
  // kernels can reach them directly.
  bool pin_host_memory = true;
  // Merge a batch's runs of adjacent ops (each starting where the previous one ended, on both
  // sides) into one op per run before they reach a transport, when at least one op in eight
  // joins its predecessor. The bytes moved are the same; KV blocks allocated in runs then travel
  // as one piece per run.
  bool merge_adjacent_ops = true;
  // Transports to start, by name; empty = every transport compiled in and usable here.
  std::vector<std::string> transports;
  // Largest notification accepted (1..max_pending_notification_bytes), and how many
  // undelivered ones an engine keeps, by count (1..kMaxPendingNotifications) and by bytes of
  // their messages (at most kMaxPendingNotificationBytes). A notification beyond either bound
  // is refused at the receiver (kResourceExhausted where the sender hears of it).
  size_t max_notification_bytes = 64 * 1024;
  size_t max_pending_notifications = 1 << 16;
  size_t max_pending_notification_bytes = 64 << 20;
  UcxOptions ucx;
  ShmOptions shm;
};

enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// One piece of a batch: `size` bytes between local_offset and remote_offset.
struct TransferOp {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t size = 0;
};

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
  std::optional<std::string> notification;
};

// How a transfer travels: which transport, and whether through a bounce buffer.
struct TransferPath {
  std::string transport;
  bool staged = false;
  std::string ToString() const;
};

struct Notification {
  std::string from;     // key of the sending engine
  std::string message;
};

class Transfer {
 public:
  Transfer() = default;  // a finished, failed transfer (kFailedPrecondition)

  // True once the transfer finished (successfully or not). Never blocks.
  bool Test() const;
  // Blocks until finished or the transfer's deadline passes; returns status().
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
  explicit Transfer(std::shared_ptr<internal::TransferState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::TransferState> state_;
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

 private:
  friend class Engine;
  explicit Session(std::shared_ptr<internal::SessionCore> core) : core_(std::move(core)) {}
  std::shared_ptr<internal::SessionCore> core_;
};

struct EngineStats {
  // Messages from peers that were malformed or reached outside registered memory, and were
  // rejected (the engine keeps serving).
  uint64_t rejected_messages = 0;
  // Notifications from peers that this engine refused (backlog full, too big) and dropped.
  uint64_t dropped_notifications = 0;
  // Ops of posted batches that joined the op before them and travelled as part of it
  // (EngineOptions::merge_adjacent_ops).
  uint64_t merged_ops = 0;
  // GPU copies this engine's transports enqueued (CUDA builds): kernel launches and the pieces
  // they copied, calls to the DMA engines and the copies they carried. A batch of many small
  // pieces is a few launches, never a call per piece.
  uint64_t gpu_kernel_launches = 0;
  uint64_t gpu_kernel_pieces = 0;
  uint64_t gpu_dma_calls = 0;
  uint64_t gpu_dma_copies = 0;
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
  // is reported here with kResourceExhausted, and a message larger than the receiver takes
  // with kInvalidArgument, neither counted at the receiver. Within
  // a process (`local`) the receiver holds it on return, and a full backlog is reported here
  // (kResourceExhausted) as well as counted. To know that the receiver holds a notification,
  // send it with a write batch (TransferOptions::notification): the batch completes only then.
  Status Notify(std::string_view peer_key, std::string_view message);
  // Takes every notification received so far, in arrival order. On an empty inbox it lets
  // the transports make progress once from this thread if they can without waiting (`ucx`:
  // a try-lock of the UCX worker, never waiting behind its progress thread; `shm`: drains the
  // notification rings, one load per ring when they are empty), so that a
  // polling thread receives without a hand-off between threads. A thread may poll it in a
  // loop, yielding between calls where cores are few (the progress threads need them too).
  std::vector<Notification> PopNotifications();

  EngineStats stats() const;

 private:
  explicit Engine(std::shared_ptr<internal::EngineCore> core);
  std::shared_ptr<internal::EngineCore> core_;
};

// The library's version, "MAJOR.MINOR.PATCH".
std::string_view Version();

}  // namespace ferry
