// Server: the embedding-offload service behind `ferry embed-serve`, one per node.
//
// GPU workers (data-parallel x tensor-parallel ranks) connect to a Unix socket and register
// (protocol.h): their per-layer output buffers and flags, and, from tensor-parallel rank 0,
// the shared inputs. A data-parallel rank's group serves the steps that its rank 0 requests,
// in order, on the group's own thread, so several data-parallel ranks are served concurrently
// (their gathers share one Gatherer's threads). Per step and layer: wait until every rank of
// the group released the layer's previous output (flag back to kFlagReset), compute the row
// ids and gather the rows into staging in chunks, copy finished chunks to every rank's buffer
// while later ones are gathered, then set every rank's flag to kFlagDone. A step that fails
// (bad request, a wait past its deadline, a rank gone) sets kFlagFailed on the layers it did
// not finish, for every rank, and its Reply carries the error.
//
// With CUDA outputs the copies to the GPUs are issued by a copy pump thread per group, behind the
// gather, in few large copies (copy_pump.h); a layer step may instead run the UVA kernel on rank
// 0's stream, writing rank 0's output directly, with device-to-device copies to the other
// ranks, when the table is pinned: StepPolicy (step_policy.h) picks per token-count bucket.
// Every layer step's phases are timed (step_stats.h) and reported by stats() and the
// protocol's StatsRequest.
//
// Connections are served by one event-loop thread (poll), not a thread each: at most
// max_connections at once; one more is answered with a Registered of kResourceExhausted and
// closed. A connection whose peer does not read its replies (the non-blocking send would wait)
// is closed. A message that cannot be read (empty, too large) fails like a malformed one.
//
// A client that disconnects (or dies) loses its registration at once; the group keeps
// serving once the rank registers again, and other groups are not affected. A group whose last
// rank left is removed, with its thread and its staging (staging.h), which exists only for
// groups with CUDA outputs and is sized by the steps served. Registrations are
// checked against the served layers and table (token bytes, n-gram context, layer indices) and
// every registered offset and size against the memory it lies in.
//
// Thread safety: Create() starts the threads (the event loop; one per data-parallel group; a
// copy pump per group with CUDA outputs); a thread that cannot start is kResourceExhausted
// (Create's error, or the registration's). Stop() (also run by the destructor) ends them; the
// accessors may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embed/config.h"
#include "embed/gather.h"
#include "embed/service/step_policy.h"
#include "embed/service/step_stats.h"
#include "ferry/embed.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// One layer the service serves: its layout (Config::layer set) and its table.
struct ServedLayer {
  Layout layout;
  std::shared_ptr<const Table> table;
};

struct ServerOptions {
  std::string socket_path;
  GatherOptions gather;  // threads, chunk size, prefetch
  std::chrono::nanoseconds wait_timeout =
      std::chrono::seconds(30);  // released outputs, absent ranks
  size_t max_queued_steps = 16;  // per data-parallel rank; more: kResourceExhausted
  // CUDA outputs: the copy pump issues a copy once this many bytes of finished chunks are
  // contiguous past the last copy (or the layer is gathered).
  uint64_t min_copy_bytes = 1 << 20;
  // Copies to host outputs (other tensor-parallel ranks) through the copy pump too, as for CUDA
  // outputs: slower (one thread copies), for tests of the pump path on machines without a GPU.
  bool pump_host_copies = false;
  // Rows gathered into the pinned staging (what the copy pump sends to GPUs) are written with
  // non-temporal stores: only the DMA engine reads them next, so the CPU neither reads the
  // staging lines for ownership nor keeps them in its caches. Measured on an H200 host
  // (bench/results/embed_service.md): the 8192-token step 1.95 -> 1.12 ms. Rows gathered
  // straight into host outputs follow gather.streaming_stores.
  bool streaming_staging = true;
  // CPU gather or UVA kernel per layer step (step_policy.h); UVA needs pinned tables.
  StepPolicyOptions policy;
  // Connections served at once (registered ranks and monitoring connections).
  size_t max_connections = 256;
};

// The longest wait_timeout ServerOptions may hold.
inline constexpr std::chrono::seconds kMaxWaitTimeout{24 * 3600};
inline constexpr size_t kMaxConnections = 65536;
inline constexpr size_t kMaxQueuedSteps = 1 << 16;

// kInvalidArgument, naming the option, for values no server runs with: an empty socket path,
// wait_timeout outside (0, kMaxWaitTimeout], max_queued_steps outside [1, kMaxQueuedSteps],
// min_copy_bytes 0, max_connections outside [1, kMaxConnections], and the gather's and policy's
// own limits (ValidateGatherOptions, ValidateStepPolicyOptions). Server::Create checks it first.
Status ValidateServerOptions(const ServerOptions& options);

// What a server holds now, for monitoring and tests.
struct ServerMemory {
  uint64_t connections = 0;    // open connections
  uint64_t groups = 0;         // data-parallel groups with a registered rank
  uint64_t staging_bytes = 0;  // the groups' staging buffers
};

class Server {
 public:
  // kInvalidArgument for options ValidateServerOptions refuses, no layers, duplicate layer
  // indices, an index past kMaxLayerIndex (no client could name it) or layouts that disagree on
  // V or N; the socket's errors (Listen: kAlreadyExists for a live service's socket,
  // kFailedPrecondition for a path that is not a socket); kResourceExhausted when a thread
  // cannot start.
  static Result<std::unique_ptr<Server>> Create(const ServerOptions& options,
                                                std::vector<ServedLayer> layers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void Stop();
  // Counters and per-bucket phase timings (step_stats.h); reset_timings clears the timings.
  ServerStats stats(bool reset_timings = false) const;
  ServerMemory memory() const;
  const std::string& socket_path() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::embed::service
