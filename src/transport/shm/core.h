// The `shm` transport's machinery: connections over Unix-domain sockets, the I/O thread that
// receives on all of them, the target side (exported regions, their memory files, revocation)
// and the initiator side (calls awaiting replies, mapped peer regions, transfers to fail when a
// connection dies).
//
// One Core per engine. Its I/O thread accepts connections, receives and handles every
// message, expires calls past their deadline and drops connections that closed. Sends go out
// from any thread (one sendmsg per message). Peers are other engines of this host run by the
// same user (checked with SO_PEERCRED).
//
// Notifications travel in a ring per connection (ring.h), made by the target when the
// initiator says hello. The target drains its rings into the inbox from the I/O thread and
// from any thread that calls Poll() (PopNotifications on an empty inbox), one drainer at a
// time. While application threads poll, the I/O thread does not ask to be woken, so a polling
// receiver costs the sender no syscall; otherwise it sets each ring's `waiting` word before it
// sleeps and the sender wakes it through the socket (kWake).
//
// Invariants of the fields read without a lock:
//  - Conn::failed_ goes false -> true once (the first Fail() wins); the failure is set under
//    the connection's mutex just after, and a reader that finds it not set yet reports
//    kUnavailable.
//  - Conn::ring_ptr_ is null until SetRing stores ring_.get() (release, under the mutex), and
//    never changes after: the ring lives as long as its connection.
//  - Core::stopping_ goes false -> true once; rejected_ and poll_calls_ are counters.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/thread_pool.h"
#include "base/unix_socket.h"
#include "transport/shm/mapping.h"
#include "transport/shm/revocation.h"
#include "transport/shm/ring.h"
#include "transport/shm/wire.h"
#include "transport/transport.h"

namespace ferry::internal::shm {

inline constexpr std::string_view kName = "shm";

// A reply (or its failure) for a call, with the descriptors attached to a kOpenReply (owned by
// the callback; -1 when none came).
using ReplyFn = std::function<void(const Status&, const Header&, int region_fd, int table_fd)>;

class Conn {
 public:
  enum class Role : uint8_t { kInitiator, kTarget };
  Conn(int fd, Role role, std::string peer_key, Duration send_timeout)
      : fd_(fd), role_(role), peer_key_(std::move(peer_key)), send_timeout_(send_timeout) {}
  ~Conn();  // closes the socket unless CloseSocket did
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // The socket; -1 once closed. For the I/O thread (the only one that closes it) and for the
  // dialing thread before the connection is handed to it.
  int fd() const NO_THREAD_SAFETY_ANALYSIS { return fd_; }
  // The I/O thread, once it dropped a failed connection: closes the socket now, so that an
  // endpoint the engine keeps for a peer that died (until it is removed or reconnected) does
  // not keep a descriptor. Waits for a Send in progress (it fails at once: Fail shut it down).
  void CloseSocket() EXCLUDES(send_mu_, fd_mu_);
  Role role() const { return role_; }
  const std::string& peer_key() const { return peer_key_; }

  Status Send(const Header& h, std::string_view payload = {}, std::span<const int> pass_fds = {})
      EXCLUDES(send_mu_);
  // Sends `h` only if it goes at once, never waiting (for application threads): when the
  // peer's socket is full, returns kResourceExhausted and sends nothing, leaving the connection
  // up. Other failures fail the connection, as Send does. One seqpacket message is atomic, so
  // it needs no lock against concurrent senders.
  Status TrySend(const Header& h) EXCLUDES(fd_mu_);
  // First call wins: marks the connection failed (kUnavailable unless `why` is kAborted), shuts
  // the socket down, fails every call waiting and every transfer tracked, revokes mappings.
  void Fail(Status why) EXCLUDES(mu_);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure() const EXCLUDES(mu_);

  // Initiator side. A call: `reply` runs on the I/O thread with the answer, or with an error
  // when the connection fails or `deadline` passes.
  Status Call(const Header& h, std::string_view payload, Deadline deadline, ReplyFn reply) EXCLUDES(mu_);
  // Completes the call `token`; false when no such call waits (the message is then rejected).
  bool Complete(uint64_t token, const Status& s, const Header& h, int region_fd, int table_fd) EXCLUDES(mu_);
  void ExpireCalls() EXCLUDES(mu_);
  // Transfers whose copies run on the pool: failed with the connection's error if it dies.
  void Track(const std::shared_ptr<TransferState>& state) EXCLUDES(mu_);
  // Mapped regions of the peer, by region id.
  std::shared_ptr<MappingSlot> FindSlot(uint64_t region) EXCLUDES(mu_);
  // Installs `slot` unless a live one exists; returns the one in place.
  std::shared_ptr<MappingSlot> InstallSlot(uint64_t region, std::shared_ptr<MappingSlot> slot) EXCLUDES(mu_);
  // The peer revokes `region`: empties its slot; kUnmapped goes back once it is unmapped.
  void RevokeSlot(uint64_t region) EXCLUDES(mu_);
  // The peer's revocation table, mapped from `table_fd` (closed here) the first time.
  Result<std::shared_ptr<const RevocationView>> View(int table_fd) EXCLUDES(mu_);
  // The notification ring the peer made (kRing): set once by the I/O thread; false (and
  // nothing changes) when it was set already.
  bool SetRing(Result<std::unique_ptr<RingWriter>> ring) EXCLUDES(mu_);
  // The ring, waiting for it until `until` (it follows the hello by one round trip).
  Result<RingWriter*> Ring(Deadline until) EXCLUDES(mu_);
  // The ring if it is set already (one load), else null.
  RingWriter* ring() const { return ring_ptr_.load(std::memory_order_acquire); }
  // A call answered without a request message of its own (a ring record carries its token).
  Result<uint64_t> Expect(Deadline deadline, ReplyFn reply) EXCLUDES(mu_);
  // Withdraws call `token`; false when it was answered already.
  bool Forget(uint64_t token) EXCLUDES(mu_);
  // Tells the peer's sleeping I/O thread that records wait (never blocks).
  void WakePeer();

  // Target side, the I/O thread's: the authentication in progress (kAuth; wire.h) and its end.
  struct Auth {
    std::string key;            // the initiator's engine key (step 0)
    std::string nonce, target;  // the initiator's nonce, the target's
    bool proven = false;
  };
  Auth& auth() { return auth_; }
  // Challenged and not proven yet (any thread): a hang-up now is a failed authentication.
  bool auth_pending() const { return auth_pending_.load(std::memory_order_acquire); }
  void set_auth_pending(bool v) { auth_pending_.store(v, std::memory_order_release); }

  // Target side: the key the initiator announced (kHello), set once by the I/O thread.
  bool hello_seen() const { return hello_seen_; }
  void set_peer_key(std::string key) {
    peer_key_ = std::move(key);
    hello_seen_ = true;
  }

 private:
  struct Waiting {
    ReplyFn reply;
    Deadline deadline;
  };
  // What a send returned, after failing the connection when the socket itself failed.
  Status Sent(Status s);
  // Written only by CloseSocket, under send_mu_ and fd_mu_; read under either (Send holds
  // send_mu_, which may wait for room; TrySend, WakePeer and Fail hold fd_mu_ briefly).
  int fd_;
  Mutex fd_mu_;
  const Role role_;
  std::string peer_key_;  // target side: written by the I/O thread before any use
  bool hello_seen_ = false;
  Auth auth_;
  std::atomic<bool> auth_pending_{false};
  const Duration send_timeout_;
  Mutex send_mu_;  // one sendmsg at a time: a message and its descriptors go together
  std::atomic<bool> failed_{false};

  mutable Mutex mu_;
  Status failure_ GUARDED_BY(mu_);
  uint64_t next_token_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Waiting> calls_ GUARDED_BY(mu_);
  std::vector<std::weak_ptr<TransferState>> tracked_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<MappingSlot>> slots_ GUARDED_BY(mu_);
  std::shared_ptr<const RevocationView> view_ GUARDED_BY(mu_);
  CondVar ring_cv_;
  bool ring_set_ GUARDED_BY(mu_) = false;
  Status ring_status_ GUARDED_BY(mu_);
  std::unique_ptr<RingWriter> ring_ GUARDED_BY(mu_);  // set once; read without mu_ via ring_ptr_
  std::atomic<RingWriter*> ring_ptr_{nullptr};  // ring_.get() once set
  std::weak_ptr<Conn> self_;
  friend class Core;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  static Result<std::shared_ptr<Core>> Create(const TransportContext& ctx);
  ~Core();
  void Shutdown();

  const std::string& socket_name() const { return socket_name_; }
  const std::string& engine_key() const { return engine_key_; }
  const ShmOptions& options() const { return options_; }
  ThreadPool* pool() const { return pool_.get(); }
  uint64_t parallel_copy_bytes() const { return parallel_copy_bytes_; }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // Connections refused because the peer did not prove the deployment's secret.
  uint64_t auth_failures() const { return auth_failures_.load(std::memory_order_relaxed); }
  // Connections refused at accept: ShmOptions::max_connections were served already.
  uint64_t connections_refused() const { return refused_.load(std::memory_order_relaxed); }
  // Drains the notification rings into the inbox from this thread; whether any had records.
  bool Poll() EXCLUDES(drain_mu_);

  // Target side.
  Result<TransportData> Register(const std::shared_ptr<Region>& region) EXCLUDES(mu_);
  void Deregister(const Region& region) EXCLUDES(mu_);

  // Initiator side: connects to the engine listening on `name` and says hello.
  Result<std::shared_ptr<Conn>> Dial(const std::string& peer_key, const std::string& name);

 private:
  explicit Core(const TransportContext& ctx);
  void Run();
  void Accept();
  void Receive(const std::shared_ptr<Conn>& conn);
  void Handle(const std::shared_ptr<Conn>& conn, os::Received& msg);
  void HandleAtTarget(const std::shared_ptr<Conn>& conn, const Message& m);
  void HandleAtInitiator(const std::shared_ptr<Conn>& conn, const Message& m, int region_fd, int table_fd);
  void Drop(const std::shared_ptr<Conn>& conn, Status why) EXCLUDES(mu_);
  void Reject(const std::string& why);
  // Target side: a peer failed authentication; counted, logged once per key, dropped.
  void RefuseAuth(const std::shared_ptr<Conn>& conn, const std::string& why);
  void HandleAuth(const std::shared_ptr<Conn>& conn, const Message& m);
  // Initiator side: proves the secret on `conn` before it is handed to the I/O thread.
  Status Authenticate(Conn& conn, Deadline deadline);
  void Wake();
  void Add(const std::shared_ptr<Conn>& conn) EXCLUDES(mu_);
  // Whether `conn` maps region `id` of ours.
  bool MapsLocked(const Conn* conn, uint64_t id) const REQUIRES(mu_);
  // Target side: makes the ring of a connection that said hello and passes it (kRing).
  void OfferRing(const std::shared_ptr<Conn>& conn) EXCLUDES(drain_mu_);
  // Moves the records of every ring into the inbox. REQUIRES: drain_mu_ held. Acks to send and
  // connections to fail go to `after`, done once the lock is released (Finish).
  struct RingEntry {
    std::shared_ptr<Conn> conn;
    std::string peer_key;
    std::unique_ptr<RingReader> reader;
  };
  struct AfterDrain {
    struct Ack {
      std::shared_ptr<Conn> conn;
      uint64_t token;
      Code code;
    };
    std::vector<Ack> acks;
    std::vector<std::shared_ptr<Conn>> broken;
  };
  bool DrainLocked(AfterDrain* after) REQUIRES(drain_mu_);
  void DrainRing(RingEntry& e, AfterDrain* after);
  // Sends the acks and fails the broken connections. On the I/O thread (`may_wait`) an ack
  // waits for room in the peer's socket up to the send timeout; on an application thread
  // (Poll) it goes only if it can at once, and otherwise is handed to the I/O thread
  // (deferred_acks_), so that a stopped peer never holds the thread that polls.
  void Finish(AfterDrain& after, bool may_wait) EXCLUDES(deferred_mu_);
  // The I/O thread, before it sleeps: drains, and asks to be woken unless threads poll.
  // Returns the poll timeout in ms.
  int PrepareToSleep() EXCLUDES(drain_mu_, deferred_mu_);
  void DropRing(const std::shared_ptr<Conn>& conn) EXCLUDES(drain_mu_);

  struct Exported {
    uint64_t address;
    uint64_t size;
    uint64_t key;  // the secret of the region's descriptor: a kOpen must carry it
    int fd;  // dup of the buffer's memory file
    uint64_t file_offset;
    uint32_t slot;  // in table_
    uint64_t generation;
    std::shared_ptr<Region> region;  // its access list (Region::Admit) is checked at kOpen
  };

  const std::string engine_key_;
  const ShmOptions options_;
  const uint64_t parallel_copy_bytes_;
  const size_t max_notification_bytes_;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<RevocationTable> table_;
  std::string socket_name_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread io_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> refused_{0};
  std::string secret_;  // EngineOptions::secret (or its file); empty = peers not authenticated
  std::set<std::string> auth_logged_;  // I/O thread: keys whose failed authentication was logged
  std::atomic<uint64_t> poll_calls_{0};  // Poll() calls: while it grows, the I/O thread sleeps lightly
  uint64_t poll_calls_seen_ = 0;        // I/O thread only

  Mutex drain_mu_;  // one drainer of the rings at a time; held briefly
  std::vector<RingEntry> rings_ GUARDED_BY(drain_mu_);
  Mutex deferred_mu_;
  std::vector<AfterDrain::Ack> deferred_acks_ GUARDED_BY(deferred_mu_);  // for the I/O thread

  mutable Mutex mu_;
  std::set<int64_t> refused_users_ GUARDED_BY(mu_);  // users refused at accept, logged once each
  CondVar unmapped_cv_;
  std::vector<std::shared_ptr<Conn>> conns_ GUARDED_BY(mu_);
  size_t accepted_ GUARDED_BY(mu_) = 0;  // target connections in conns_ (max_connections)
  bool refusing_ GUARDED_BY(mu_) = false;  // a refusal was logged since the last admission
  std::unordered_map<uint64_t, Exported> exported_ GUARDED_BY(mu_);
  // Regions of ours each peer maps, by connection (an entry leaves with its connection, Drop).
  std::unordered_map<const Conn*, std::set<uint64_t>> mapped_ GUARDED_BY(mu_);
};

}  // namespace ferry::internal::shm
