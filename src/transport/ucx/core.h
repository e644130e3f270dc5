// The state of one engine's `ucx` transport: UCX context, workers and listener, registered
// regions, connections to peers and the tables of operations waiting for an answer.
//
// Workers: UcxOptions::workers shards, each one UCX worker with its own progress thread (see
// worker.h) and the state that thread owns: its connections, their endpoints and the
// operations sent on them. A connection begins with ferry's handshake at the target's door
// (door.h), which gives it an id and the target's worker address; the initiator opens its
// lanes to that worker, and the target opens as many endpoints back to the initiator's worker
// (an Accepted connection) for its answers. So each shard's tables are complete on their own.
// Connections that peers make here are served by shard 0.
//
// Threads: a Shard's UCX objects and tables are touched only by the thread that holds its
// worker (worker.h): its progress thread, or an application thread that took the worker to
// send a notification or to progress it (Core::Poll); regions_ is guarded by regions_mu_
// because registration happens on user threads. Conn::failed_ and Core::rejected_ are atomics
// read from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "transport/transport.h"
#include "transport/ucx/access_wire.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/door.h"
#include "transport/ucx/rma_policy.h"
#include "transport/ucx/staged.h"
#include "transport/ucx/worker.h"

namespace ferry::internal::ucx {

class Core;
struct Shard;

// A connection to one peer on one shard: `lanes` UCX endpoints, and the remote keys unpacked
// on them.
class Conn : public std::enable_shared_from_this<Conn> {
 public:
  // `id`, `worker_address` (checked and padded), `control`: from the handshake (door.h); the
  // Conn owns `control`.
  Conn(std::shared_ptr<Core> core, Shard* shard, EngineDesc peer, std::string address, bool same_host,
       uint64_t id, std::string worker_address, int control)
      : core_(std::move(core)), shard_(shard), peer_(std::move(peer)), address_(std::move(address)),
        same_host_(same_host), id_(id), worker_address_(std::move(worker_address)), control_(control) {}
  ~Conn();

  // The id the target gave this connection: every message on it carries it.
  uint64_t id() const { return id_; }
  const EngineDesc& peer() const { return peer_; }
  Shard& shard() const { return *shard_; }
  bool same_host() const { return same_host_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure() const EXCLUDES(failure_mu_);
  // Whether the peer has answered anything sent on this connection (it is up, not merely
  // being dialled).
  bool answered() const { return answered_.load(std::memory_order_acquire); }
  void MarkAnswered() const { answered_.store(true, std::memory_order_release); }

  // Holding shard()'s worker only.
  Status Open(int lanes);
  void Fail(Status why) EXCLUDES(failure_mu_);
  void Close();
  size_t lanes() const { return eps_.size(); }
  // REQUIRES: !failed() (a failed connection has no endpoints)
  ucp_ep_h ep(size_t lane) const { return eps_[lane % eps_.size()]; }
  // The remote key of `remote` on `lane`, unpacked once; kFailedPrecondition once revoked.
  Result<ucp_rkey_h> RemoteKey(const MemoryDesc& remote, size_t lane);
  // The target deregistered `region`: drop its keys and refuse further RMA to it.
  void Revoke(uint64_t region);
  // Whether the target closed the handshake's socket (it dropped this connection, e.g. to
  // fence this engine, or its process ended): then nothing sent on it is applied any more.
  bool TargetClosed();

 private:
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);

  std::shared_ptr<Core> core_;
  Shard* const shard_;
  const EngineDesc peer_;
  const std::string address_;
  const bool same_host_;
  const uint64_t id_;
  const std::string worker_address_;
  int control_;  // the handshake's socket, closed with the connection
  std::atomic<bool> failed_{false};
  mutable std::atomic<bool> answered_{false};
  mutable Mutex failure_mu_;
  Status failure_ GUARDED_BY(failure_mu_);
  std::vector<ucp_ep_h> eps_;
  std::unordered_map<uint64_t, std::vector<ucp_rkey_h>> rkeys_;  // by remote region id
  std::set<uint64_t> revoked_;
};

// A connection a peer made to this engine (shard 0): its identity, from the handshake, and the
// endpoints this engine opened back to the peer's worker for its answers, one per lane.
struct Accepted {
  uint64_t id = 0;
  std::string peer_key;
  std::vector<ucp_ep_h> eps;
  ucp_ep_h ep(uint8_t lane) const { return eps[lane % eps.size()]; }
};

// Where the answer to a request goes: the accepted connection and lane it came on.
struct Reply {
  uint64_t conn = 0;
  uint8_t lane = 0;
};

// An operation waiting for an ack or a read response from a peer.
struct Pending {
  std::shared_ptr<TransferState> state;
  const Conn* conn = nullptr;  // the connection it went out on (fails with it)
  uint64_t accepted = 0;       // or the id of the accepted connection it went out on
  std::byte* dst = nullptr;  // read responses land here
  uint64_t size = 0;
  std::function<void(Status)> on_data = nullptr;  // staged reads: runs instead of completing the part
};

// Tokens that match answers to requests. A peer sees only the tokens of its own requests, and
// must not be able to guess another peer's (and so complete that peer's transfers with a forged
// ack or read response): each token is a keyed bijective mix of a counter, so none repeats
// before 2^64 requests and none is 0 (0 marks a one-way message).
class TokenSource {
 public:
  TokenSource();
  uint64_t Next();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// One UCX worker, its progress thread and the state of the worker's callbacks. Everything
// but `worker` is for the thread that holds the worker (Worker::Held()).
struct Shard {
  Core* core = nullptr;
  size_t index = 0;
  std::unique_ptr<Worker> worker;
  std::string worker_address;  // ucp_worker_get_address, for handshakes
  std::set<std::shared_ptr<Conn>> conns;
  std::unordered_map<uint64_t, Conn*> conn_by_id;  // our connections, by the id their target gave
  std::unordered_map<uint64_t, std::unique_ptr<Accepted>> accepted;  // shard 0: peers' connections
  std::unordered_map<ucp_ep_h, uint64_t> accepted_by_ep;
  std::unordered_map<uint64_t, Pending> pending;
  // Shard 0: rendezvous receives of peers' writes in flight, by accepted connection id (they
  // land in registered memory when they end, even after the connection was dropped).
  std::unordered_map<uint64_t, uint32_t> receiving;
  TokenSource tokens;
  uint64_t sends_in_flight = 0;

  uint64_t AddPending(Pending p);
  void FailPending(const Conn* conn, uint64_t accepted_id, const Status& why);
  Accepted* FindAccepted(uint64_t id) {
    auto it = accepted.find(id);
    return it == accepted.end() ? nullptr : it->second.get();
  }
  // The endpoint to answer a request of accepted connection `conn` that came on `lane`, or null
  // once that connection is gone.
  ucp_ep_h ReplyEp(uint64_t conn, uint8_t lane) {
    Accepted* a = FindAccepted(conn);
    return a == nullptr ? nullptr : a->ep(lane);
  }
  // Sends an active message whose payload is `data` (h.size bytes; must stay valid until the
  // send completes, e.g. registered memory) or, when `data` is null, `payload`.
  void Send(ucp_ep_h ep, const AmHeader& h, const void* data, std::string payload,
            bool eager = false, std::shared_ptr<void> hold = nullptr);
  void EndReceive(uint64_t conn) {
    auto it = receiving.find(conn);
    if (it != receiving.end() && --it->second == 0) receiving.erase(it);
  }
  // Acks `token` to accepted connection `conn` on `lane`, if it is still there.
  // `region`: the region a refusal is about (kPermissionDenied), so that the initiator's error
  // names it; 0 otherwise.
  void SendAck(uint64_t conn, uint8_t lane, uint64_t token, Code code, uint64_t region = 0);
  // The same on one of this shard's own connections (an ack of a target's revocation).
  void SendAckOn(const Conn& conn, uint64_t token, Code code);
};

// A random non-zero 64-bit key (the system's entropy source).
uint64_t RandomKey();

class Core : public std::enable_shared_from_this<Core> {
 public:
  // `copier`: how GPU memory is staged; null = the CUDA one (staged.h).
  static Result<std::shared_ptr<Core>> Create(const TransportContext& ctx,
                                              std::unique_ptr<StageCopier> copier = nullptr);
  ~Core();
  void Shutdown();  // stops the workers; idempotent

  const UcxOptions& options() const { return options_; }
  const std::string& engine_key() const { return engine_key_; }
  const RmaPolicy& rma() const { return rma_; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  ucp_context_h context() const { return context_; }
  size_t shards() const { return shards_.size(); }
  Shard& shard(size_t i) { return *shards_[i % shards_.size()]; }
  // The shard a new connection starts on: round robin.
  size_t NextShard() { return next_shard_.fetch_add(1, std::memory_order_relaxed) % shards_.size(); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // Connections the door refused (door.h).
  uint64_t refused_connections() const;
  // Handshakes refused for want of a valid proof of the deployment's secret (door.h).
  uint64_t auth_failures() const;
  // Connections the door refused for want of room (max_connections, max_pending_handshakes).
  uint64_t connections_refused() const;
  bool authenticates() const { return !secret_.empty(); }
  uint16_t listen_port() const { return door_ ? door_->port() : 0; }
  // GPU memory staged through bounce buffers (staged.h).
  Stager& stager() { return *stager_; }

  Result<TransportData> Register(const std::shared_ptr<Region>& region) EXCLUDES(regions_mu_);
  // From a user thread: ferry's handshake with `peer` at `address` for a connection on shard
  // `shard`, until `deadline`; then the Conn opens `lanes` endpoints (on its shard's thread).
  Result<std::shared_ptr<Conn>> Dial(const EngineDesc& peer, const std::string& address, bool same_host,
                                     size_t shard, int lanes, Deadline deadline);
  void Deregister(const Region& region) EXCLUDES(regions_mu_);

  // From a user thread: sends `h` (and `payload`) on lane 0 of `conn` with a fresh token and
  // waits for the peer's ack until `deadline`.
  Status Call(const std::shared_ptr<Conn>& conn, AmHeader h, std::string payload, Deadline deadline);

  bool UseRma(const Conn& conn) const;

  // From a user thread: drops every connection that peer `key` made here, so that its
  // messages still on the way (a cut link's queue) are refused when they come, and waits until
  // the writes of those connections that were already landing (rendezvous receives) ended.
  // kDeadlineExceeded when some are still landing at `deadline` (call again later).
  Status FencePeer(const std::string& key, Deadline deadline);

  // From an application thread: progresses each worker that it can take without waiting
  // (Worker::TryProgress). Returns whether any made progress.
  bool Poll();

 private:
  struct Registered {
    std::shared_ptr<Region> region;
    ucp_mem_h memh = nullptr;
    uint64_t key = 0;
  };
  Core() = default;
  Status Listen();
  // The region that request `h` names, if h.key is its key and the engine of accepted
  // connection h.conn (the key it gave, and proved with a secret, in the handshake) is on the
  // region's access list; otherwise null, and *refusal says why: kFailedPrecondition (no such
  // region, a wrong key, a connection that is gone: the caller rejects the message) or
  // kPermissionDenied (counted and logged through the region; answered, not rejected).
  // On shard 0's thread (it holds the accepted connections).
  std::shared_ptr<Region> FindRegion(Shard& s, const AmHeader& h, Code* refusal) EXCLUDES(regions_mu_);
  void Reject(const char* why);
  static void Forget(Shard& s);

  // A peer's worker address fit to give UCX (see core_connect.cc), padded; kInvalidArgument otherwise.
  Result<std::string> CheckedWorkerAddress(std::string_view address) const;
  // Door thread: opens the endpoints back to an initiator's worker on shard 0.
  Welcome Admit(const Hello& hello, Deadline deadline);
  // Shard 0: forgets accepted connection `id` (its control socket closed, or an endpoint failed).
  void DropAccepted(uint64_t id, const Status& why);
  static void OnAcceptedError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  void HandleWrite(Shard& s, const AmHeader& h, void* data, const ucp_am_recv_param_t* param, bool* keep);
  void HandleReadReq(Shard& s, const AmHeader& h);
  void HandleReadResp(Shard& s, const AmHeader& h, void* data, const ucp_am_recv_param_t* param, bool* keep);
  void HandleAck(Shard& s, const AmHeader& h);
  void HandleNotify(Shard& s, const Accepted& from, const AmHeader& h, const void* data, size_t length);
  void HandleCheck(Shard& s, const AmHeader& h);
  void HandleRevoke(Shard& s, const AmHeader& h);

  std::string engine_key_;
  std::string secret_;  // EngineOptions::secret (or its file); empty = peers not authenticated
  UcxOptions options_;
  std::shared_ptr<Inbox> inbox_;
  RmaPolicy rma_;
  ucp_context_h context_ = nullptr;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<size_t> next_shard_{0};
  std::unique_ptr<Door> door_;
  std::vector<std::string> addresses_;
  std::atomic<uint64_t> rejected_{0};
  bool shut_down_ = false;

  Mutex regions_mu_;
  std::unordered_map<uint64_t, Registered> regions_ GUARDED_BY(regions_mu_);

  std::unique_ptr<Stager> stager_;

  friend class Conn;
  friend class Stager;
  friend struct Stager::Impl;
};

}  // namespace ferry::internal::ucx
