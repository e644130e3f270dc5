// `ferry pd`'s configuration: model presets, the command's flags checked into a PdConfig, and
// the part of it each worker process needs (WorkerConfig, sent to it as one JSON line).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "pd_arrivals.h"

namespace ferry::tools::pd {

// A model's KV-cache shape. MLA models hold one latent of `head_dim` elements per token, the
// same on every TP rank.
struct Preset {
  std::string name;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;  // 1 for MLA
  uint32_t head_dim = 0;  // the latent width for MLA
  uint32_t dtype_bytes = 2;
  bool mla = false;
  uint32_t block_tokens = 16;
  std::string about;  // one line for --help and the summary
};
const std::vector<Preset>& Presets();
// kInvalidArgument naming the known presets when `name` is none of them.
Result<Preset> FindPreset(std::string_view name);
// Bytes of KV one token takes on a rank holding `heads` heads, over every layer (K and V).
uint64_t TokenBytes(const Preset& p, uint32_t heads);

// The heads rank `tp_rank` of `tp_size` holds, by the connector's rule (kv.h): heads / tp each,
// or one replicated head when tp_size > heads; MLA: the one latent on every rank. Computed
// here on its own so that the decode side's check does not trust the code it checks.
struct HeadSlice {
  uint32_t first = 0;
  uint32_t count = 0;
};
HeadSlice HeadsOf(uint32_t total_heads, bool mla, uint32_t tp_size, uint32_t tp_rank);
// kInvalidArgument naming `flag` unless heads divide over tp (or tp over heads).
Status CheckTpSplit(const Preset& p, uint32_t tp, std::string_view flag);

enum class Mode : uint8_t { kWrite, kRead };
enum class MemoryPlace : uint8_t { kHost, kGpu };
// The prefill layer's compute stand-in: a sleep on the CPU, or a kernel spinning on the GPU
// (gpu::Stream::Spin) whose layer write waits for it through a CUDA event.
enum class Compute : uint8_t { kSleep, kGpu };

// The command line as given.
struct PdFlags {
  std::string model = "tiny";
  uint32_t layers = 0;  // 0: the preset's
  uint32_t prefill = 1;
  uint32_t decode = 1;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint32_t prefill_dp = 1;
  uint32_t decode_dp = 1;
  uint32_t block_tokens = 0;         // 0: the preset's
  uint32_t decode_block_tokens = 0;  // 0: --block-tokens
  std::string layout = "kv_first";
  std::string decode_layout;  // empty: --layout
  std::string memory = "host";
  std::string compute = "sleep";
  int device = 0;
  std::string transport = "shm";
  std::string mode = "write";
  uint64_t requests = 20;
  double rate = 0;  // requests per second; 0 = all at once
  std::string prompt_tokens = "64..512";
  std::string trace;
  double layer_us = 200;
  uint64_t blocks = 0;  // per worker; 0 = enough for 8 of the longest prompts
  uint64_t seed = 1;
  double timeout_s = 60;
  double transfer_timeout_s = 10;
  uint64_t kill_prefill_after = 0;  // 0 = never
  uint64_t kill_decode_after = 0;   // 0 = never
  uint64_t stop_prefill_after = 0;  // 0 = never
  double stop_ms = 0;               // how long it stays stopped; 0 = until the run ends
  double prefix_hit = 0;            // the share of each prompt the decode side already holds
  bool checksums = false;
  bool busy_poll = false;
  bool json = false;
};

// One side (prefill or decode) of the run.
struct SideConfig {
  uint32_t instances = 1;
  uint32_t dp = 1;  // DP ranks of each instance, each of `tp` workers and its own blocks
  uint32_t tp = 1;
  uint32_t block_tokens = 16;
  std::string layout;
  uint64_t blocks = 0;  // per worker
};

// The flags, checked.
struct PdConfig {
  Preset preset;
  SideConfig prefill;
  SideConfig decode;
  MemoryPlace memory = MemoryPlace::kHost;
  Compute compute = Compute::kSleep;
  int device = 0;
  std::string transport;
  Mode mode = Mode::kWrite;
  std::vector<Arrival> arrivals;  // sorted by time
  std::chrono::microseconds layer_time{};
  std::chrono::nanoseconds timeout{};
  std::chrono::nanoseconds transfer_timeout{};
  uint64_t kill_prefill_after = 0;
  uint64_t kill_decode_after = 0;
  // SIGSTOP a prefill worker after this many requests ended, SIGCONT after stop_time (zero:
  // when the run ends).
  uint64_t stop_prefill_after = 0;
  std::chrono::milliseconds stop_time{0};
  double prefix_hit = 0;
  bool checksums = false;
  bool busy_poll = false;
  bool json = false;

  bool fault_run() const {
    return kill_prefill_after != 0 || kill_decode_after != 0 || stop_prefill_after != 0;
  }
  // The tokens of a `tokens`-token prompt that the decode side already holds: floor(prefix_hit
  // * tokens / L) * L, L the least common multiple of both sides' block sizes (the connector
  // moves whole blocks of both from the first token on).
  uint64_t PrefixHitTokens(uint64_t tokens) const;
};

// Checks every flag (the message names the flag; kInvalidArgument) and reads the trace file.
// Layout names are checked by the caller, which knows the connector's names.
Result<PdConfig> Configure(const PdFlags& flags);

// What one worker process is told at its start.
struct WorkerConfig {
  bool prefill = true;
  std::string instance;  // "p0", "d1"
  uint32_t dp_rank = 0;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string model;    // a preset name
  uint32_t layers = 0;  // the preset's, or --layers
  uint32_t block_tokens = 16;
  std::string layout;
  uint64_t blocks = 0;
  bool gpu = false;
  bool gpu_compute = false;  // prefill: Compute::kGpu
  int device = 0;
  std::string transport;
  bool read_mode = false;
  uint64_t layer_us = 0;
  uint64_t transfer_timeout_ms = 0;
  bool checksums = false;
  bool busy_poll = false;

  std::string ToJson() const;
  // Rejects malformed input and values out of range (it comes from another process).
  static Result<WorkerConfig> FromJson(std::string_view text);
};

WorkerConfig MakeWorkerConfig(const PdConfig& c, bool prefill, uint32_t instance, uint32_t dp_rank,
                              uint32_t tp_rank);
// The engine transports a worker uses for --transport `name` (cuda_ipc carries no
// notifications: the connector's messages go over shm beside it).
std::vector<std::string> EngineTransports(const std::string& name);
std::string InstanceName(bool prefill, uint32_t instance);
// The run's shape for its summary: "1P(dp1, tp2, kv_first) -> 1D(dp1, tp1, kv_first), blocks of
// 16 -> 16 tokens".
std::string Shape(const PdConfig& c);

}  // namespace ferry::tools::pd
