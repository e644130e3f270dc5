// The transport interface: what every way of moving bytes implements.
//
// A Transport (one per engine) registers memory and connects to peers; an Endpoint is its
// connection to one peer, shared by every session to that peer; a Channel is a route from one
// local region to one remote region through that endpoint, on which batches are posted.
// Transports declare their capabilities and the engine chooses among them by capability and
// cost, never by name. Adding a transport means adding a folder and a line in the CMake list
// of transports (see src/transport/CMakeLists.txt); the engine includes no transport header.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/descriptors.h"
#include "ferry/options.h"
#include "ferry/types.h"
#include "ferry/status.h"
#include "transport/inbox.h"
#include "transport/region.h"
#include "transport/transfer_state.h"

namespace ferry::cuda {
class CopyEngines;  // cuda/copy_engine.h
}  // namespace ferry::cuda

namespace ferry::internal {

// How far a transport reaches, nearest first.
enum class Reach : uint8_t { kSameProcess = 0, kSameHost = 1, kNetwork = 2 };

struct Capabilities {
  bool host_memory = false;
  bool cuda_memory = false;
  Reach reach = Reach::kSameProcess;
  bool notifications = false;
  // Lower is preferred when several transports can carry a session.
  int cost = 100;
};

// What a transport gets from the engine that starts it.
struct TransportContext {
  std::string engine_key;
  const EngineOptions* options = nullptr;  // outlives the transport
  std::shared_ptr<Inbox> inbox;            // where received notifications go
  // The engine's GPU copy engines (one per device, made on first use), shared by every
  // transport that copies with CUDA, so that an engine has one stream and completion thread
  // per device and its EngineStats gpu_* counters come from one place. Null where a test starts
  // a transport on its own: such a transport makes a set of its own.
  std::shared_ptr<cuda::CopyEngines> copy_engines = nullptr;
};

// A route from one local region to one remote region. Ops given to Post() are already
// validated against both regions.
// Storage that a channel offers for a batch's ops (Channel::ReserveOps), which it then moves
// from as they lie: the engine copies and checks the caller's ops into it, so that the checked
// copy is the one the transport uses and no second pass copies them again.
class OpSpace {
 public:
  virtual ~OpSpace() = default;
  virtual TransferOp* data() = 0;
  // What the engine's check found: no op of the batch is longer (UINT64_MAX: not known).
  virtual void set_max_op_size(uint64_t bytes) = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Moves `ops` asynchronously. The channel calls state.AddParts(n) for the parts it runs and
  // state.PartDone() for each; it holds the regions it touches through state.Hold().
  // Returns an error (and posts nothing) when a region is gone.
  virtual Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) = 0;
  // Storage for a batch of `n` ops of kind `op` that this channel moves from without copying them again
  // (PostReserved); null when it has none for such a batch (the engine uses its own).
  virtual std::unique_ptr<OpSpace> ReserveOps(Op /*op*/, size_t /*n*/) { return nullptr; }
  // Post, for `ops` at the start of `space` (from this channel's ReserveOps), as checked.
  virtual Status PostReserved(Op op, OpSpace& /*space*/, std::span<const TransferOp> ops, uint64_t total_bytes,
                              const std::shared_ptr<TransferState>& state) {
    return Post(op, ops, total_bytes, state);
  }
  virtual TransferPath path() const = 0;
};

// A connection to one peer engine.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local,
                                                       const MemoryDesc& remote) = 0;
  // Delivers a notification; ordered after the data of writes already completed.
  virtual Status Notify(std::string_view message) = 0;
  // Delivers a notification as one more part of `state`: AddParts(1), then PartDone() once the
  // receiver has it (or it failed). The default calls Notify() on this thread.
  virtual void NotifyPart(std::string message, const std::shared_ptr<TransferState>& state) {
    state->AddParts(1);
    state->PartDone(Notify(message).WithContext("data written, notification failed"));
  }
  // False once the connection failed; the engine then connects anew.
  virtual bool healthy() const { return true; }
  // True once nothing of the connection is left for the transport to close (every part of it
  // failed and was closed): the engine then drops it from its caches even if the peer is never
  // asked for again (a peer whose process restarted as another engine), and dropping it closes
  // nothing. An endpoint of several connections that failed only in part is not dead.
  virtual bool dead() const { return !healthy(); }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  virtual Capabilities caps() const = 0;
  // What peers need to reach this engine through this transport (goes into EngineDesc).
  virtual TransportData Describe() const = 0;
  // Addresses where peers can reach this engine ("host:port"), if the transport listens.
  virtual std::vector<std::string> Addresses() const { return {}; }
  // Makes a region reachable; returns what peers need to reach it (goes into MemoryDesc).
  virtual Result<TransportData> Register(const std::shared_ptr<Region>& region) = 0;
  // Makes a region unreachable for peers. kDeadlineExceeded when a peer may still write into or
  // read from it (a peer process that holds it and does not let go in time): the engine keeps
  // the region and calls again when the user retries; a call after one that returned OK, or for
  // a region this transport never registered, returns OK.
  virtual Status Deregister(const Region& region) = 0;
  // Whether this transport can reach `peer` at all (e.g. same process, same host).
  virtual bool CanReach(const EngineDesc& peer) const = 0;
  virtual Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) = 0;
  // Makes progress once on the calling thread if the transport can without waiting (e.g. its
  // worker is not held by another thread), so that notifications that arrived land in the
  // inbox without a hand-off between threads. Returns whether anything happened. Called by
  // PopNotifications() on an empty inbox.
  virtual bool Poll() { return false; }
  // Messages from peers rejected as malformed or out of bounds.
  virtual uint64_t rejected_messages() const { return 0; }
  // Connections refused because the peer did not prove the deployment's secret.
  virtual uint64_t auth_failures() const { return 0; }
  // Connections refused at accept because the transport held its limit of connections (and
  // pending handshakes dropped by a full listener).
  virtual uint64_t connections_refused() const { return 0; }
  // Ends every connection that peer `key` made to this engine, so that nothing it sent before
  // the call (data still queued in a link that was cut, say) is applied to this engine's memory
  // afterwards; its later requests come over a new connection. By `deadline`. The default is
  // for transports where a peer's writes are its own copies, not messages that this engine
  // applies (local, shm, cuda_ipc): there is nothing queued here to refuse, and OK.
  virtual Status FencePeer(std::string_view key, Deadline deadline) {
    (void)key;
    (void)deadline;
    return Status::Ok();
  }
  // The engine is closing: drop every connection, fail what waits on a peer (kAborted) and
  // accept nothing more. Registered regions are deregistered afterwards.
  virtual void Shutdown() {}
};

using TransportFactory = Result<std::unique_ptr<Transport>> (*)(const TransportContext&);

struct TransportEntry {
  std::string_view name;
  TransportFactory make;
};

// Every transport compiled into this build, in registration order.
std::span<const TransportEntry> RegisteredTransports();

}  // namespace ferry::internal
