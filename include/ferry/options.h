// The settings of an engine and of its transports, with their defaults and bounds. Values
// outside the bounds fail Engine::Create with kInvalidArgument.
//
// From the environment: every field can be set by a variable FERRY_<FIELD> (nested:
// FERRY_UCX_<FIELD>, FERRY_SHM_<FIELD>), named after the member in capitals; the table in
// docs/configuration.md lists them. Engine::Create does not read the environment: explicit is
// better. The `ferry` CLI and Python's ferry.Engine() call EngineOptions::FromEnv (their flags and
// keyword arguments override it); a C++ program that wants the variables calls it itself:
//
//   FERRY_ASSIGN_OR_RETURN(EngineOptions options, EngineOptions::FromEnv());
//   options.key = "prefill-0";  // code overrides the environment
//
// Values: durations in milliseconds or with a unit (500ms, 2s, 250us, 1min; whole numbers);
// sizes in bytes or with K, M or G (binary); booleans 0, 1, true, false; lists comma-separated.
// A bad value is kInvalidArgument naming the variable, never a silent default.
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

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

  // `base` with the FERRY_UCX_* variables that are set applied (see the top of this file).
  static Result<UcxOptions> FromEnv(const UcxOptions& base);
  static Result<UcxOptions> FromEnv();  // from the defaults
};

// Settings of the `shm` transport: host memory of this host's processes, reached in buffers
// from ferry::AllocateSharedHost (ferry/shared_memory.h).
struct ShmOptions {
  // How long deregistering a region waits for the peers that map it to unmap it; a peer that
  // has not answered by then (e.g. a stopped process) is disconnected.
  std::chrono::milliseconds revoke_timeout = std::chrono::seconds(5);
  // How long a round trip to a peer (mapping its region, Engine::Notify) may take.
  std::chrono::milliseconds call_timeout = std::chrono::seconds(10);
  // Peers' connections served at once (1..kMaxShmConnections; this engine's own connections to
  // peers are not counted): each holds a socket. One past it is closed at accept (the peer
  // finds it closed: kUnavailable), logged once per burst and counted in
  // EngineStats::connections_refused; a place frees when a peer hangs up.
  size_t max_connections = 512;
  // Users (uids) besides this process's own whose processes may connect to this engine's shm
  // socket, and whose engines' sockets this one connects to. Each end checks the other's user
  // with SO_PEERCRED; anyone else is refused at accept and counted in
  // EngineStats::rejected_messages. Empty: the same user only. Root gets no exception.
  std::vector<uint32_t> allowed_uids;

  // `base` with the FERRY_SHM_* variables that are set applied (see the top of this file).
  static Result<ShmOptions> FromEnv(const ShmOptions& base);
  static Result<ShmOptions> FromEnv();  // from the defaults
};

// Bounds of EngineOptions' counts; values outside them fail Engine::Create (kInvalidArgument).
inline constexpr int kMaxCopyThreads = 1024;
inline constexpr size_t kMaxPendingNotifications = size_t{1} << 24;
inline constexpr size_t kMaxPendingNotificationBytes = size_t{1} << 40;
inline constexpr size_t kMaxShmConnections = size_t{1} << 20;

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
  // How long Transfer::Wait (and WaitAll, WaitAny) polls a GPU transfer without sleeping before
  // it sleeps between polls (at most 50 us apart). A GPU copy completes through a CUDA event:
  // polled, it is seen done within a few microseconds; left to the completion thread's blocking
  // wait, 30-55 us later on an H200 machine. The waiting thread is busy (yielding) meanwhile.
  // 0 = sleep between polls at once. At most 1 s.
  Duration wait_spin = std::chrono::milliseconds(2);
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
  // How many of those undelivered notifications may come from one peer (by its engine key), so
  // that one peer that floods cannot fill the backlog and starve the others: beyond it that
  // peer's notifications are refused as the full backlog refuses them (kResourceExhausted,
  // counted in EngineStats::dropped_notifications). 0 = a quarter of max_pending_notifications
  // but at least 64 (all of a smaller backlog, which one peer's burst may fill); at most
  // max_pending_notifications (a larger value is that).
  size_t max_pending_notifications_per_peer = 0;
  // Port of an HTTP endpoint serving GET /metrics (Prometheus text) on listen host 127.0.0.1;
  // 0 = off, -1 = pick a free port (Engine::MetricsPort() says which); 1..65535 = that port.
  int metrics_port = 0;
  // The secret the engines of one deployment share (at least 16 bytes). Set: every connection
  // of the ucx transport begins with a mutual challenge-response (HMAC-SHA256 over fresh nonces
  // from both sides; the secret never travels and is in no descriptor), and a peer that cannot
  // prove it holds the secret is refused before anything is served (counted in
  // EngineStats::auth_failures). Empty: peers are not authenticated (`ferry info` says so).
  // Within a host, shm admits processes of the same user only (SO_PEERCRED) either way.
  std::string secret;
  // The same, read from this file, which only its owner may read (chmod 600); not with `secret`.
  std::string secret_file;
  UcxOptions ucx;
  ShmOptions shm;

  // `base` with every FERRY_* variable that is set applied, FERRY_UCX_* and FERRY_SHM_*
  // included (see the top of this file); the first bad value is kInvalidArgument naming it.
  static Result<EngineOptions> FromEnv(const EngineOptions& base);
  static Result<EngineOptions> FromEnv();  // from the defaults
};

}  // namespace ferry
