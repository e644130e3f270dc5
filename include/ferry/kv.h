// The KV-cache connector for disaggregated serving: prefill (producer) workers hand a request's
// KV cache to decode (consumer) workers through an Engine, layer by layer.
//
// A worker describes its cache once (CacheLayout: the model, the tensor-parallel slice it
// holds, the block size, and per layer where K and V live as byte strides), registers the
// memory with its Engine, and creates a Connector. Two workers that meet exchange
// WorkerMetadata (engine descriptor, layout, region descriptors, compatibility hash); a
// mismatch of what must agree (model, dtype, head dim, layers, heads, version) is an error that
// names the field, before any byte moves. Tensor-parallel sizes, block sizes and layouts may
// differ between the sides: the planner maps every head and token to its place on both.
//
// Write mode (push): the consumer allocates blocks for request R and calls ExpectWrite(); the
// allocation travels to each producer rank that holds some of the heads it needs. The producer
// calls SaveLayer() as each layer is computed; layers saved before the allocation arrives wait
// (deferred) and go out, in order, the moment it does. After the last layer (Seal()) the
// completion notice follows every byte of every layer. The consumer's PopFinished() names R
// once every producer rank's completion is in; the producer's names R once its writes finished
// and its blocks may be freed.
//
// Read mode (pull): the producer holds R's blocks (HoldForRead()) and returns ReadParams for the
// router to pass on; the consumer reads every layer (StartRead()), WaitLayer() blocks until a
// layer has landed, and after the last layer the consumer releases the producer's blocks.
//
// Block ownership fails closed: every request ends exactly once (done, failed or aborted) on
// each side, every wait has a deadline, and blocks are handed back to the caller only when no
// peer can still read or write them: after the peer confirmed, or is known dead, or
// abort_timeout passed (counted in stats()). A consumer that gives up on R (Abort(), timeout)
// keeps R's blocks until then, so no late write lands in a block that was handed back. Where it
// has no proof that the producer's writes ended (no confirmation, a lost link, writes that the
// producer reports ended unanswered), it first fences the producer (Engine::FencePeer, counted
// in stats().peers_fenced): writes still queued in a cut link are refused when it comes back.
//
// Thread safety: a Connector may be used from many threads at once. Its own worker thread polls
// the engine's notifications on kTopic, runs deferred writes and enforces the timeouts.
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
#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry::kv {

namespace internal {
struct ConnectorAccess;
}  // namespace internal

// The version of the connector's messages and metadata (part of the compatibility hash).
inline constexpr uint32_t kKvVersion = 2;
// The engine notification topic the connector's messages travel on.
inline constexpr std::string_view kTopic = "ferry.kv";

// Bounds that the layout and message decoders enforce.
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxRegions = 4096;
inline constexpr uint32_t kMaxTpSize = 1024;
inline constexpr uint32_t kMaxHeads = 1u << 16;
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxNameBytes = 256;

// Where one tensor (K, V or an MLA latent) of one layer lives inside one registered region, as
// byte strides. The byte of (kernel block b, token t, local head h, byte i) is at
//   offset + b * block_stride + t * token_stride + h * head_stride + i,   i < head bytes.
// Every standard layout is one such description: flash-attention's KV-first [2, N, bs, H, D]
// (K and V at offsets 0 and N * block_stride), FlashInfer's blocks-first [N, 2, bs, H, D]
// (V at block_stride / 2), HND [N, H, bs, D] (heads before tokens), separate K and V tensors,
// MLA [N, bs, latent].
struct TensorLayout {
  uint32_t region = 0;  // index into CacheLayout::region_bytes (and the regions registered)
  uint64_t offset = 0;
  uint64_t block_stride = 0;
  uint64_t token_stride = 0;
  uint64_t head_stride = 0;  // unused when the worker holds one head
  friend bool operator==(const TensorLayout&, const TensorLayout&) = default;
};

struct LayerLayout {
  TensorLayout k;
  std::optional<TensorLayout> v;  // absent for MLA (one latent per token)
  friend bool operator==(const LayerLayout&, const LayerLayout&) = default;
};

struct CacheLayout {
  // What must agree between the two sides (the compatibility hash covers these and kKvVersion).
  std::string model;
  uint32_t dtype_bytes = 2;
  uint32_t head_dim = 0;        // elements per head; the latent width for MLA
  uint32_t total_kv_heads = 0;  // the model's KV heads over every TP rank; 1 for MLA
  bool mla = false;             // one latent per token, the same on every TP rank
  uint32_t num_layers = 0;

  // This worker: its slice of the heads follows from tp_rank of tp_size (total_kv_heads /
  // tp_size heads each, or one replicated head when tp_size > total_kv_heads).
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t dp_rank = 0;
  uint32_t block_tokens = 16;        // the scheduler's block, in tokens
  uint32_t kernel_block_tokens = 0;  // the attention kernel's block; 0 = block_tokens
  uint64_t num_blocks = 0;           // scheduler blocks
  std::vector<uint64_t> region_bytes;  // size of each region the tensors live in
  std::vector<LayerLayout> layers;     // num_layers entries

  uint64_t head_bytes() const { return uint64_t{head_dim} * dtype_bytes; }
  uint32_t kernel_block() const { return kernel_block_tokens ? kernel_block_tokens : block_tokens; }
  // The model's heads this worker holds: [first_head(), first_head() + heads()).
  uint32_t heads() const;
  uint32_t first_head() const;

  // Every count in bounds, heads divisible across TP ranks (or replicated), kernel block
  // dividing the block, and every byte any block may hold inside its region.
  Status Validate() const;
  // A hash of the fields that must agree between producer and consumer, with kKvVersion.
  uint64_t CompatibilityHash() const;

  std::string Pack() const;
  static Result<CacheLayout> Unpack(std::string_view bytes);

  friend bool operator==(const CacheLayout&, const CacheLayout&) = default;
};

// OK when a producer and a consumer may exchange KV; otherwise kInvalidArgument naming the first
// field that differs ("head_dim: 128 vs 64").
Status CheckCompatible(const CacheLayout& a, const CacheLayout& b);

// The standard tensor orders that MakeLayout builds (N blocks, bs tokens, H heads, D elements).
enum class TensorOrder : uint8_t {
  kKvFirst,        // [2, N, bs, H, D]: flash-attention (NHD)
  kKvFirstHnd,     // [2, N, H, bs, D]
  kBlocksFirst,    // [N, 2, bs, H, D]: FlashInfer (NHD)
  kBlocksFirstHnd, // [N, 2, H, bs, D]
  kSeparate,       // K and V are two tensors [N, bs, H, D], one region each
  kSeparateHnd,    // K and V are two tensors [N, H, bs, D]
  kMla,            // [N, bs, latent]
};
std::string_view TensorOrderName(TensorOrder order);
Result<TensorOrder> ParseTensorOrder(std::string_view name);

// Fills region_bytes and layers of `identity` (whose other fields are set) for `order`, with one
// region per layer (per tensor for kSeparate*), or with every layer in one region when
// `one_region` (layers one after the other). Validates the result.
Result<CacheLayout> MakeLayout(CacheLayout identity, TensorOrder order, bool one_region = false);

// A worker's name: its instance (unique among every prefill and decode instance), DP and TP
// rank.
struct WorkerId {
  std::string instance;
  uint32_t dp_rank = 0;
  uint32_t tp_rank = 0;
  std::string ToString() const;  // "instance/dp0/tp3"
  friend auto operator<=>(const WorkerId&, const WorkerId&) = default;
};

// What a worker tells its peers: what its handshake endpoint serves.
struct WorkerMetadata {
  uint32_t version = kKvVersion;
  WorkerId id;
  EngineDesc engine;
  CacheLayout layout;
  std::vector<MemoryDesc> regions;  // layout.region_bytes.size() entries
  uint64_t compatibility_hash = 0;

  std::string Pack() const;
  // Rejects malformed input, other versions, a hash that does not match the layout, and
  // regions that do not match the layout's sizes.
  static Result<WorkerMetadata> Unpack(std::string_view bytes);
};

enum class Role : uint8_t { kProducer, kConsumer, kBoth };
enum class Mode : uint8_t { kWrite, kRead };

struct ConnectorOptions {
  Role role = Role::kBoth;
  Mode mode = Mode::kWrite;
  // This worker's instance name (its DP and TP rank come from the layout).
  std::string instance;
  // Producer, write mode: a saved layer whose allocation has not arrived after this long fails
  // the request, and its blocks are handed back.
  Duration deferred_write_timeout = std::chrono::seconds(60);
  // Consumer: a request whose data is not complete this long after ExpectWrite()/StartRead()
  // fails, with its blocks reported for recompute. Also the deadline of each transfer.
  Duration transfer_timeout = std::chrono::seconds(30);
  // How long a side keeps blocks that a peer may still touch when the peer neither confirms
  // (release in read mode, abort confirmation in write mode) nor is known dead.
  Duration abort_timeout = std::chrono::seconds(480);
  // How often a side with requests outstanding on a peer checks that the peer is alive; a peer
  // that cannot be reached ends those requests.
  Duration liveness_interval = std::chrono::seconds(1);
  // A per-layer checksum of the KV moved (host or GPU memory: on the GPU a kernel on the
  // connector's own stream computes it), computed by the producer where the data is and
  // checked by the consumer over its own blocks; a mismatch fails the request (kDataLoss).
  bool checksums = false;
  // Fetching a peer's metadata from its handshake endpoint.
  Duration handshake_timeout = std::chrono::seconds(5);
  // Connect to a peer when it is learnt (AddPeer): a first message sets up the transport's
  // connection and sessions to its regions are opened, so its first request pays for neither.
  bool eager_connect = false;
  // While any request is open, the worker thread polls (its calls, the transfers' ends and the
  // engine's transports) instead of sleeping, so nothing on a request's path waits for a thread
  // to be woken: the lowest latency, at the price of one core kept busy while requests are open.
  // Off: the worker sleeps and is woken (a few to tens of microseconds a wake-up).
  bool busy_poll = false;
};

// How a request's data becomes ready on the producer: e.g. gpu::EventWaiter(event). Called
// (on the connector's thread) before the layer's write is posted, with the longest it may
// take; an error fails the request.
using ReadyFn = std::function<Status(Duration timeout)>;
// The ReadyFn of a CUDA event (a cudaEvent_t recorded after the layer's kernels, e.g.
// gpu::Event::handle() or torch.cuda.Event's cuda_event): waits for it with gpu::WaitEvent. The
// event must stay alive until the layer's save ended.
ReadyFn EventReady(void* cuda_event);

// What a producer hands back in read mode, for the router to pass to the consumer.
struct ReadParams {
  std::string request;
  WorkerId producer;  // any rank of the producing instance
  uint32_t producer_tp_size = 1;
  std::string handshake;  // the producer rank's handshake address ("host:port"), may be empty
  std::vector<uint64_t> blocks;
  uint64_t num_tokens = 0;
  std::string Pack() const;
  static Result<ReadParams> Unpack(std::string_view bytes);
};

enum class Outcome : uint8_t { kDone, kFailed, kAborted };

// A request that ended on this side. Its blocks are the caller's again.
struct Finished {
  std::string request;
  Outcome outcome = Outcome::kDone;
  Status status;                 // why, when not done
  std::vector<uint64_t> blocks;  // the local blocks; on a consumer failure, those to recompute
  bool producer = false;         // which side of the request this worker was
  // When the connector ended it (steady clock), before the caller popped it.
  std::chrono::steady_clock::time_point at;
};

struct ConnectorStats {
  uint64_t requests_done = 0;
  uint64_t requests_failed = 0;
  uint64_t requests_aborted = 0;
  uint64_t layers_written = 0;  // (layer, consumer rank) writes that landed
  uint64_t layers_read = 0;
  uint64_t layers_deferred = 0;  // saved before their allocation arrived
  uint64_t bytes = 0;
  uint64_t ops_posted = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t messages_rejected = 0;   // malformed, unknown request, wrong peer
  uint64_t blocks_expired = 0;      // handed back after abort_timeout with no confirmation
  uint64_t checksum_failures = 0;
  uint64_t peers_lost = 0;
  // Producers fenced (Engine::FencePeer) before blocks they may still write went back.
  uint64_t peers_fenced = 0;
};

class Connector {
 public:
  // `engine` must outlive the connector; `regions` are the engine's registrations of the
  // layout's regions, in order.
  static Result<std::unique_ptr<Connector>> Create(Engine* engine, const CacheLayout& layout,
                                                   std::vector<MemoryDesc> regions,
                                                   const ConnectorOptions& options);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  const WorkerId& id() const;
  // This worker's metadata, packed (what the handshake endpoint serves).
  std::string Metadata() const;
  // Starts a handshake endpoint on host:port (0 = pick a free one); returns "host:port".
  Result<std::string> ServeHandshake(const std::string& host = "127.0.0.1", uint16_t port = 0);
  // Learns a peer worker from its metadata (checked for compatibility) or fetches it from a
  // handshake endpoint, within handshake_timeout. A worker learnt again under another engine
  // (its process restarted) replaces the one before: the connector's sessions to the old engine
  // are dropped once no worker names it, and the engine lets go of its connection once the
  // transport found it dead; the old engine's open requests end as they would have (the peer's
  // liveness, their deadlines).
  Status AddPeer(std::string_view metadata);
  Status AddPeerFrom(const std::string& handshake_address);

  // ---- consumer ----
  // Write mode: blocks `blocks` (scheduler ids) wait for request R's KV from instance
  // `producer` at DP rank `producer_dp`. After a prefix hit, `first_token` is the first token
  // that moves (on a block boundary of both sides) and `blocks` hold the tokens from it on.
  // `num_tokens` tokens move (0: as many as the blocks hold). Every TP rank of the producer's
  // must be known (AddPeer). An empty list (a full prefix hit) moves nothing but still tells
  // the producer, which then frees its blocks.
  Status ExpectWrite(std::string_view request, std::string_view producer, uint32_t producer_dp,
                     std::span<const uint64_t> blocks, uint64_t num_tokens = 0, uint64_t first_token = 0);
  // Read mode: reads every layer of R into `blocks`, as laid out in `params` (the producer's
  // blocks from `first_token` on, as above).
  Status StartRead(const ReadParams& params, std::span<const uint64_t> blocks, uint64_t first_token = 0);
  // Read mode: blocks until layer `layer` of R has landed (OK), R failed (its error), or
  // `timeout` passed (kDeadlineExceeded).
  Status WaitLayer(std::string_view request, uint32_t layer, Duration timeout);

  // ---- producer ----
  // Write mode: layer `layer` of R (whose source blocks are `blocks`) is computed once `ready`
  // returns OK (no `ready`: now). Posted as soon as the consumer's allocation is known.
  // kFailedPrecondition when R already ended here, failed or aborted, and its Finished was
  // published (for instance, its consumer aborted it before this application began it): nothing
  // more of R will be reported. Kept for `abort_timeout` after R's end; Seal() does the same.
  Status SaveLayer(std::string_view request, uint32_t layer, std::span<const uint64_t> blocks,
                   ReadyFn ready = nullptr);
  // Write mode: R saved `layers_saved` layers and no more will come; the completion follows
  // them.
  Status Seal(std::string_view request, uint32_t layers_saved);
  // Read mode: keeps R's blocks until the consumer releases them; returns what the consumer
  // needs to read them.
  Result<ReadParams> HoldForRead(std::string_view request, std::span<const uint64_t> blocks,
                                 uint64_t num_tokens = 0);

  // Either side: gives up on R. It ends (kAborted) once no peer can touch its blocks.
  Status Abort(std::string_view request);

  // The requests that ended since the last call, on either side.
  std::vector<Finished> PopFinished();
  // Blocks until at least one request ended or `timeout` passed; then as PopFinished().
  std::vector<Finished> WaitFinished(Duration timeout);
  // Requests not yet ended on this side.
  size_t pending() const;

  ConnectorStats stats() const;

 private:
  friend struct internal::ConnectorAccess;
  struct Impl;
  explicit Connector(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::kv
