// The embedding-offload service, the public API of its server side: Server (what
// `ferry embed-serve` runs, one per node), its options, the layers it serves and how they are
// made (MakeServedLayers), and the policy that picks the CPU gather or the UVA kernel per layer
// step. Its clients are in ferry/embed_service.h, its statistics in ferry/embed_stats.h.
//
// GPU workers (data-parallel x tensor-parallel ranks) connect to a Unix socket and register
// their per-layer output buffers and flags, and, from tensor-parallel rank 0, the shared
// inputs. A data-parallel rank's group serves the steps that its rank 0 requests, in order, on
// the group's own thread, so several data-parallel ranks are served concurrently (their
// gathers share one Gatherer's threads). Per step and layer: wait until every rank of the group
// released the layer's previous output (flag back to kFlagReset), compute the row ids and
// gather the rows into staging in chunks, copy finished chunks to every rank's buffer while
// later ones are gathered, then set every rank's flag to kFlagDone. A step that fails (bad
// request, a wait past its deadline, a rank gone) sets kFlagFailed on the layers it did not
// finish, for every rank, and its Reply carries the error.
//
// With CUDA outputs the copies to the GPUs are issued by a copy pump thread per group, behind
// the gather, in few large copies, and the layers of a step overlap: layer k + 1 is gathered
// while layer k's last copies run, and the pump sets layer k's DONE behind them (DONE still in
// layer order, each after all of its layer's bytes). A layer step may instead run the UVA
// kernel on rank 0's stream, writing rank 0's output directly, with device-to-device copies to the other ranks,
// when the table is pinned: the step policy (StepPolicyOptions) picks per token-count bucket.
// Every layer step's phases are timed and reported by stats() and the protocol's StatsRequest.
//
// Connections are served by one event-loop thread (poll), not a thread each: at most
// max_connections at once; one more is answered with a Registered of kResourceExhausted and
// closed. A connection whose peer does not read its replies is closed. A client that
// disconnects (or dies) loses its registration at once; the group keeps serving once the rank
// registers again, and other groups are not affected. A group whose last rank left is removed,
// with its thread and its staging (which exists only for groups with CUDA outputs and is sized
// by the steps served). Registrations are checked against the served layers and table (token
// bytes, n-gram context, layer indices) and every registered offset and size against the
// memory it lies in.
//
// Thread safety: Server::Create() starts the threads (the event loop; one per data-parallel
// group; a copy pump per group with CUDA outputs); a thread that cannot start is
// kResourceExhausted (Create's error, or the registration's). Stop() (also run by the
// destructor) ends them; the accessors may be called from any thread. The options and
// ServedLayer are values (a ServedLayer's table is shared and read-only); the free functions
// may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/embed.h"
#include "ferry/embed_stats.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// Which path runs a layer step for CUDA outputs. kOff: always the CPU gather. kAlways: the UVA
// kernel whenever the step can run it. kAuto: for each token-count bucket, the first `probes`
// layer steps of each path are probes (alternating, the path with fewer samples first, CPU on
// ties); then the path with the lower median of its last `window` measured layer-step times
// runs, and every `reprobe_every`-th choice in a bucket runs the other path once, so a change
// in either path's cost is seen. A step that cannot run UVA (host outputs, an unpinned table)
// runs the CPU path and does not count towards the choice.
enum class UvaMode : uint8_t { kOff = 0, kAlways = 1, kAuto = 2 };
// "off", "always", "auto"; kInvalidArgument otherwise.
Result<UvaMode> ParseUvaMode(std::string_view s);
std::string_view UvaModeName(UvaMode m);

struct StepPolicyOptions {
  UvaMode mode = UvaMode::kAuto;
  int probes = 3;          // measured steps of each path per bucket before choosing; >= 1
  int window = 8;          // recent times per path and bucket the median is taken of; >= 1
  int reprobe_every = 64;  // every n-th choice runs the other path once; 0: never
};

inline constexpr int kMaxPolicyCount = 1 << 20;

// kInvalidArgument, naming the option, for probes or window outside [1, kMaxPolicyCount] or
// reprobe_every outside [0, kMaxPolicyCount].
Status ValidateStepPolicyOptions(const StepPolicyOptions& options);

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
  // CPU gather or UVA kernel per layer step; UVA needs pinned tables.
  StepPolicyOptions policy;
  // Connections served at once (registered ranks and monitoring connections).
  size_t max_connections = 256;
  // Users (uids) besides this process's own whose processes may connect (SO_PEERCRED); anyone
  // else is refused at accept and logged. Empty: the same user only. The service writes into
  // its clients' GPU memory and reads their tokens: name only users of the same deployment.
  std::vector<uint32_t> allowed_uids;
  // CPUs kept for the copy pumps, so that they and the gather threads do not take turns on
  // the same cores: the last pump_cpus CPUs this process may run on go to the pumps, the others
  // to the gather threads (the groups' threads and the Gatherer's workers). -1 (auto): one CPU
  // when there are more CPUs than gather.threads, else none; 0: nothing is pinned. At most
  // the CPUs available less one (the gather keeps one).
  int pump_cpus = -1;
  // The layers of a step overlap on the copy-pump path (layer k + 1 gathered while layer k's
  // copies finish). false: each layer's copies and DONE complete before the next layer starts,
  // as before the overlap (kept for side-by-side measurements).
  bool overlap_layers = true;
};

// The longest wait_timeout ServerOptions may hold.
inline constexpr std::chrono::seconds kMaxWaitTimeout{24 * 3600};
inline constexpr size_t kMaxConnections = 65536;
inline constexpr size_t kMaxQueuedSteps = 1 << 16;
inline constexpr int kMaxPumpCpus = 1024;

// kInvalidArgument, naming the option, for values no server runs with: an empty socket path,
// wait_timeout outside (0, kMaxWaitTimeout], max_queued_steps outside [1, kMaxQueuedSteps],
// min_copy_bytes 0, max_connections outside [1, kMaxConnections], pump_cpus outside
// [-1, kMaxPumpCpus], and the gather's and policy's
// own limits (ValidateGatherOptions, ValidateStepPolicyOptions). Server::Create checks it first.
Status ValidateServerOptions(const ServerOptions& options);

// Whether a server may listen at `path` (checked before anything is built): OK for nothing
// there or a stale socket (no process accepts on it; Create replaces it) in an existing
// folder; kAlreadyExists for a socket a live service accepts on; kFailedPrecondition for a
// path that is not a socket; kInvalidArgument for an empty path or one too long for a socket;
// kNotFound when its folder does not exist.
Status CheckListenPath(const std::string& path);

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
  // V or N; the socket's errors (kAlreadyExists for a live service's socket, kFailedPrecondition
  // for a path that is not a socket); kResourceExhausted when a thread cannot start.
  static Result<std::unique_ptr<Server>> Create(const ServerOptions& options,
                                                std::vector<ServedLayer> layers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void Stop();
  // Counters and per-bucket phase timings (ferry/embed_stats.h); reset_timings clears the
  // timings.
  ServerStats stats(bool reset_timings = false) const;
  ServerMemory memory() const;
  const std::string& socket_path() const;

  struct Impl;  // defined inside the service

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The layers a service serves, from one base configuration (Config::layer ignored) and a list
// of layer indices: each layer's Layout, and either one synthetic table shared by all layers
// (sized for the largest layer unless `synthetic_rows` says otherwise) or one safetensors file
// per layer, in the order of `layers`. `pool` (optional, MakeWorkers) fills a synthetic table
// in parallel.
//
// A synthetic table larger than the memory available (memory_limit, or with 0
// AvailableMemoryBytes()) is refused with kResourceExhausted naming its size, before any of it
// is allocated. With `pin` non-null every table is also page-locked (Table::Pin, for the UVA
// path) before it is shared, and *pin gets the result: a table that cannot be pinned is still
// served (unpinned).
//
// kInvalidArgument for no layers, a bad configuration or a file count other than 0 or
// layers.size(); kResourceExhausted for a synthetic table larger than the memory available; the
// table's errors otherwise.
Result<std::vector<ServedLayer>> MakeServedLayers(const Config& base,
                                                  std::span<const uint32_t> layers, Dtype dtype,
                                                  std::span<const std::string> files,
                                                  uint64_t synthetic_rows, ThreadPool* pool,
                                                  Status* pin = nullptr,
                                                  uint64_t memory_limit = 0);

// The bytes of memory this process may still take: the smaller of /proc/meminfo's
// MemAvailable and what its cgroup (v2) allows (memory.max less memory.current); UINT64_MAX
// when neither can be read.
uint64_t AvailableMemoryBytes();

}  // namespace ferry::embed::service
