// The embedding-offload wire protocol between GPU workers (clients) and `ferry embed-serve`.
//
// Each message is one SOCK_SEQPACKET datagram holding a msgpack array
//   [kEmbedProtocolVersion, type, fields...]
// where type is the message's 1-based index in AnyMessage below.
// decoded with ferry's bounded codec (base/codec.h): every count, size and rank is checked
// against the limits below before anything is allocated, and anything malformed, truncated or
// of another version is kInvalidArgument (kUnsupported for another version).
//
//   Register  client -> service, once per connection, with descriptors (SCM_RIGHTS):
//             fd 0 the outputs memfd (host mode), then the inputs memfd (tensor-parallel rank 0).
//   Registered service -> client: the registration's Status.
//   Request   tensor-parallel rank 0 -> service: one step {seq, dp_rank, num_tokens, num_reqs}.
//   Reply     service -> tensor-parallel rank 0: the step's Status, after its last layer.
//   StatsRequest  any -> service, as the first message of a connection that does not register
//             (it may send more): asks for the service's counters and phase timings.
//   Stats     service -> that connection: ServerStats (ferry/embed_stats.h).
//
// Flag words (uint32) hold kFlagReset, kFlagDone or kFlagFailed; a waiter waits for >= kFlagDone,
// so a failed step never leaves it blocked.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/embed_service.h"
#include "ferry/embed_stats.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// The version of this protocol (the messages below and their fields): the first element of
// every message. Unrelated to the descriptor version (ferry/descriptors.h).
inline constexpr uint64_t kEmbedProtocolVersion = 1;

// The flag values, the limits of counts and sizes and OutputMode: ferry/embed_service.h.
// Further limits every decoder enforces.
inline constexpr size_t kMaxStatusMessage = 4096;
inline constexpr size_t kCudaIpcHandleBytes = 64;

// One layer's output buffer (max_tokens x token_bytes) and flag word of one client.
struct LayerOutput {
  uint32_t layer = 0;          // the model's layer index (the table's Config::layer)
  uint64_t output_offset = 0;  // host: offset in the outputs memfd; cuda: in the allocation
  uint64_t flag_offset = 0;    // likewise, 4-byte aligned
  std::string output_ipc;      // cuda: cudaIpcMemHandle_t bytes of the output's allocation
  std::string flag_ipc;        // cuda: of the flag's allocation
};

// Offsets of the shared inputs in the inputs memfd (tensor-parallel rank 0 only):
// input ids [max_tokens] int32, query start locations [max_reqs + 1] int32 and n-gram context
// [max_reqs x context_len] int32, each 4-byte aligned.
struct InputOffsets {
  uint64_t ids = 0;
  uint64_t query_start_loc = 0;
  uint64_t ngram_context = 0;
};

struct Register {
  uint32_t dp_rank = 0;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  OutputMode mode = OutputMode::kHost;
  int32_t device = -1;       // cuda: the client's device ordinal
  uint64_t max_tokens = 0;   // >= 1
  uint64_t max_reqs = 0;     // >= 1
  uint64_t context_len = 0;  // N - 1
  uint64_t token_bytes = 0;  // one token's output row: E values
  std::vector<LayerOutput> layers;
  bool has_inputs = false;  // true exactly for tp_rank 0
  InputOffsets inputs;
};

struct Registered {
  Status status;
};

struct Request {
  uint64_t seq = 0;
  uint32_t num_tokens = 0;
  uint32_t num_reqs = 0;
  uint32_t dp_rank = 0;  // must be the sender's registered data-parallel rank
};

struct Reply {
  uint64_t seq = 0;
  Status status;
};

struct StatsRequest {
  bool reset = false;  // clear the phase timings after taking them
};

struct Stats {
  ServerStats stats;
};

// Every message. A message's type on the wire is its 1-based index here (Register 1, Registered
// 2, Request 3, Reply 4, StatsRequest 5, Stats 6), so a new message goes at the end.
using AnyMessage = std::variant<Register, Registered, Request, Reply, StatsRequest, Stats>;

// The part of a client's registration its options give: its ranks, its capacity and its layers
// (offsets 0, no IPC handles). The client adds the mode, the offsets, handles and inputs.
Register RegisterOf(const ClientOptions& o);

std::string Encode(const Register& m);
std::string Encode(const Registered& m);
std::string Encode(const Request& m);
std::string Encode(const Reply& m);
std::string Encode(const StatsRequest& m);
std::string Encode(const Stats& m);

// Decodes one message; the errors listed above. Checks ranges that need no other state
// (tp_rank < tp_size, limits, has_inputs == (tp_rank == 0), alignment, IPC handle sizes).
Result<AnyMessage> Decode(std::string_view bytes);

// The seq of a message that begins as a Request of this version ([version, 3, seq, ...])
// whether or not the rest decodes (a truncated or out-of-range request), so that its failure
// can be answered under its own seq; nullopt when the bytes do not begin so.
std::optional<uint64_t> RequestSeqOf(std::string_view bytes);

}  // namespace ferry::embed::service
