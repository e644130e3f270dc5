// The embedding-offload client: a GPU worker's side of the protocol it speaks with
// `ferry embed-serve` (the role of vLLM's PleOffloadConnector), one Client per data-parallel x
// tensor-parallel rank, and the protocol's limits and flag values that a worker needs.
//
// Create() allocates the shared memory (the inputs on tensor-parallel rank 0; in host mode the
// per-layer outputs and flags too), connects to the service and registers. Then, per forward:
//   rank 0 writes the step's inputs (input_ids(), query_start_loc(), ngram_context()) and calls
//   PrepareForward(num_reqs, num_tokens, dummy), which sends the request; every rank calls
//   Wait(slot) before it reads a layer's output and ReleaseOutputs() after the forward.
// A dummy (or capture) forward sends nothing and satisfies the waits locally (zero rows, DONE).
//
// Failures: a failed step sets its flags to kFlagFailed, so Wait() returns at once with the
// step's error (the service's reply on rank 0; kAborted naming the layer on other ranks). When
// the connection to the service is lost, or a step gets no reply within step_timeout, the
// client sets every flag to kFlagFailed itself, so no wait is left blocked, and every later
// call returns kUnavailable (connection lost) or the step's kDeadlineExceeded. An error from a
// step's reply that no Wait() reported is returned by the next PrepareForward().
//
// Host mode keeps outputs and flags in shared host memory and waits on the host (what CI runs
// without a GPU); CUDA mode keeps them in device memory shared through CUDA IPC, and the waits
// and resets are stream memory operations.
//
// Every forward is prepared, waited for and released in turn: a PrepareForward() before the
// previous forward's ReleaseOutputs() is kFailedPrecondition (its waits would pass on the
// previous step's DONE flags and read its rows), and a step larger than the registered
// capacity is kOutOfRange before anything is sent.
//
// Thread safety: one thread drives PrepareForward/Wait/ReleaseOutputs; a background thread
// reads the service's replies. The accessors may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::embed::service {

// The version of the wire protocol this build speaks (the first element of every message).
uint64_t ProtocolVersion();

// Flag words (uint32) hold kFlagReset, kFlagDone or kFlagFailed; a waiter waits for
// >= kFlagDone, so a failed step never leaves it blocked.
inline constexpr uint32_t kFlagReset = 0;
inline constexpr uint32_t kFlagDone = 1;
inline constexpr uint32_t kFlagFailed = 2;

// Limits of the protocol, which every decoder enforces (and ClientOptions must respect).
inline constexpr uint64_t kMaxDpRanks = 1024;
inline constexpr uint64_t kMaxTpSize = 64;
inline constexpr uint64_t kMaxLayers = 256;
inline constexpr uint64_t kMaxLayerIndex = 4096;
inline constexpr uint64_t kMaxTokens = 1u << 20;
inline constexpr uint64_t kMaxRequests = 1u << 16;
inline constexpr uint64_t kMaxContext = 15;
inline constexpr uint64_t kMaxTokenBytes = 1u << 20;

// Where a client's outputs and flags live.
enum class OutputMode : uint8_t {
  kHost = 0,  // in the outputs memfd (the CPU-only mode)
  kCuda = 1,  // in device memory, reached through CUDA IPC handles
};

// The longest connect_timeout and step_timeout ClientOptions may hold.
inline constexpr std::chrono::seconds kMaxClientTimeout{24 * 3600};

struct ClientOptions {
  std::string socket_path;
  uint32_t dp_rank = 0;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint64_t max_tokens = 0;  // capacity of a step
  uint64_t max_reqs = 0;
  uint64_t context_len = 0;      // N - 1
  uint64_t token_bytes = 0;      // one token's output: E values
  std::vector<uint32_t> layers;  // the model's layer indices, in the order of the forward
  std::chrono::nanoseconds connect_timeout = std::chrono::seconds(10);
  std::chrono::nanoseconds step_timeout = std::chrono::seconds(30);

  // kCuda: outputs and flags in device memory of `device`, waits on CUDA streams.
  OutputMode mode = OutputMode::kHost;
  int device = 0;
  // kCuda: per layer, max_tokens x token_bytes device bytes and one 4-byte device word (e.g.
  // torch tensors' data_ptr()), which must stay allocated while the client lives; empty: the
  // client allocates them.
  std::vector<void*> cuda_outputs;
  std::vector<void*> cuda_flags;
};

// Device (or host) pointers the step's inputs are copied from, asynchronously on the stream
// passed to PrepareForward (the runner's persistent input buffers).
struct StepSources {
  const int32_t* input_ids = nullptr;
  const int32_t* query_start_loc = nullptr;
  const int32_t* ngram_context = nullptr;
};

class Client {
 public:
  // kInvalidArgument for options outside the protocol's limits or timeouts outside
  // (0, kMaxClientTimeout]; kUnavailable when no service answers by connect_timeout; the
  // service's registration error otherwise (kNotFound for an unknown layer, kInvalidArgument,
  // kOutOfRange, kAlreadyExists, kResourceExhausted when it serves as many connections as it
  // may); kResourceExhausted when the client's thread cannot start.
  static Result<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const;
  size_t slots() const;  // = options().layers.size()

  // Tensor-parallel rank 0's shared inputs (empty spans on other ranks).
  std::span<int32_t> input_ids();        // max_tokens
  std::span<int32_t> query_start_loc();  // max_reqs + 1
  std::span<int32_t> ngram_context();    // max_reqs x context_len, row-major
  // A slot's output rows: max_tokens x token_bytes (host mode; empty in CUDA mode).
  std::span<uint8_t> output(size_t slot);
  // The slot's output and flag in device memory (CUDA mode; null in host mode).
  void* device_output(size_t slot) const;
  void* device_flag(size_t slot) const;
  // The flag's value now (CUDA mode: read with a copy); kFlagFailed for a bad slot.
  uint32_t flag(size_t slot) const;

  // Rank 0, not dummy: without `sources` the step's inputs must be written already and the
  // request goes out now; with `sources` (CUDA mode) they are copied on `stream`, and a
  // background thread sends the request once the copies are done. Dummy: zero rows and DONE
  // flags, on `stream` in CUDA mode. Returns an error a previous step left unreported, then
  // kFailedPrecondition when the previous forward was not released, kOutOfRange (rank 0, not
  // dummy) for more than max_tokens tokens or max_reqs requests.
  Status PrepareForward(uint32_t num_reqs, uint32_t num_tokens, bool dummy, void* stream = nullptr,
                        const StepSources* sources = nullptr);
  // Host mode: waits until the slot's flag is DONE or FAILED, up to step_timeout. CUDA mode:
  // makes `stream` wait for flag >= DONE (cuStreamWaitValue32 GEQ; capturable in a graph) and
  // returns at once.
  Status Wait(size_t slot, void* stream = nullptr);
  // Resets every flag (on `stream` in CUDA mode): the outputs may be overwritten next step.
  Status ReleaseOutputs(void* stream = nullptr);
  // Disconnects; the service frees the registration. Later calls return kFailedPrecondition.
  void Close();

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  Status PrepareStep(uint32_t num_reqs, uint32_t num_tokens, bool dummy, void* stream,
                     const StepSources* sources);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::embed::service
