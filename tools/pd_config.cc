#include "pd_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "units.h"

namespace ferry::tools::pd {
namespace {

constexpr uint32_t kMaxInstances = 64;
constexpr uint32_t kMaxTp = 64;
constexpr uint32_t kMaxDp = 64;
constexpr uint64_t kMaxWorkersASide = 256;  // processes of one side, over instances, DP and TP
constexpr uint32_t kMaxBlockTokens = 4096;
constexpr uint64_t kMaxBlocks = 1 << 24;
constexpr uint64_t kMaxTraceBytes = 64 << 20;
constexpr uint32_t kMaxLayers = 1024;  // kv::kMaxLayers

Status Bad(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Bad(fmt::format("--trace: cannot open '{}'", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxTraceBytes)
    return Bad(fmt::format("--trace: '{}' is over 64 MiB", path));
  return text.str();
}

Result<SideConfig> Side(const Preset& p, uint32_t instances, uint32_t dp, uint32_t tp,
                        uint32_t block_tokens, const std::string& layout, std::string_view name) {
  if (instances < 1 || instances > kMaxInstances)
    return Bad(fmt::format("--{} must be in 1..{}, not {}", name, kMaxInstances, instances));
  if (dp < 1 || dp > kMaxDp)
    return Bad(fmt::format("--{}-dp must be in 1..{}, not {}", name, kMaxDp, dp));
  if (tp < 1 || tp > kMaxTp)
    return Bad(fmt::format("--{}-tp must be in 1..{}, not {}", name, kMaxTp, tp));
  FERRY_RETURN_IF_ERROR(CheckTpSplit(p, tp, fmt::format("--{}-tp", name)));
  if (uint64_t{instances} * dp * tp > kMaxWorkersASide)
    return Bad(fmt::format("--{0} x --{0}-dp x --{0}-tp is {1} workers, over {2}", name,
                           uint64_t{instances} * dp * tp, kMaxWorkersASide));
  SideConfig s;
  s.instances = instances;
  s.dp = dp;
  s.tp = tp;
  s.block_tokens = block_tokens == 0 ? p.block_tokens : block_tokens;
  s.layout = layout;
  return s;
}

}  // namespace

const std::vector<Preset>& Presets() {
  static const std::vector<Preset> presets = {
      {"tiny", 4, 4, 16, 2, false, 16, "4 layers, 4 KV heads of 16, bf16: for tests"},
      {"tiny-mla", 4, 1, 48, 2, true, 16, "4 layers, MLA latent 48, bf16: for tests"},
      {"llama-3.1-8b", 32, 8, 128, 2, false, 16, "32 layers, 8 KV heads of 128, bf16"},
      {"llama-3.1-70b", 80, 8, 128, 2, false, 16, "80 layers, 8 KV heads of 128, bf16 (TP 4 or 8)"},
      {"deepseek-v3", 61, 1, 576, 2, true, 64, "61 layers, MLA latent 576, bf16"},
  };
  return presets;
}

Result<Preset> FindPreset(std::string_view name) {
  std::string known;
  for (const Preset& p : Presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  return Bad(fmt::format("--model '{}' is not a preset ({})", name, known));
}

uint64_t TokenBytes(const Preset& p, uint32_t heads) {
  return uint64_t{p.layers} * (p.mla ? 1 : 2) * heads * p.head_dim * p.dtype_bytes;
}

HeadSlice HeadsOf(uint32_t total_heads, bool mla, uint32_t tp_size, uint32_t tp_rank) {
  if (mla || total_heads == 0 || tp_size == 0) return {0, 1};
  if (tp_size > total_heads)
    return {static_cast<uint32_t>(uint64_t{tp_rank} * total_heads / tp_size), 1};
  const uint32_t each = total_heads / tp_size;
  return {tp_rank * each, each};
}

Status CheckTpSplit(const Preset& p, uint32_t tp, std::string_view flag) {
  if (p.mla || tp == 0) return Status::Ok();
  if (p.kv_heads % tp == 0 || tp % p.kv_heads == 0) return Status::Ok();
  return Bad(fmt::format("{} {} does not split {}'s {} KV heads (one must divide the other)", flag,
                         tp, p.name, p.kv_heads));
}

Result<PdConfig> Configure(const PdFlags& f) {
  PdConfig c;
  FERRY_ASSIGN_OR_RETURN(c.preset, FindPreset(f.model));
  if (f.layers > kMaxLayers)
    return Bad(fmt::format("--layers must be in 0..{}, not {}", kMaxLayers, f.layers));
  if (f.layers != 0) c.preset.layers = f.layers;  // the model's shape with fewer or more layers
  if (f.block_tokens > kMaxBlockTokens || f.decode_block_tokens > kMaxBlockTokens)
    return Bad(fmt::format("--block-tokens and --decode-block-tokens must be at most {}",
                           kMaxBlockTokens));
  FERRY_ASSIGN_OR_RETURN(c.prefill, Side(c.preset, f.prefill, f.prefill_dp, f.prefill_tp,
                                         f.block_tokens, f.layout, "prefill"));
  const uint32_t decode_bt = f.decode_block_tokens != 0 ? f.decode_block_tokens : f.block_tokens;
  FERRY_ASSIGN_OR_RETURN(c.decode,
                         Side(c.preset, f.decode, f.decode_dp, f.decode_tp, decode_bt,
                              f.decode_layout.empty() ? f.layout : f.decode_layout, "decode"));
  if (c.preset.mla && (c.prefill.layout != "mla" || c.decode.layout != "mla")) {
    // An MLA model has one layout; take it unless another was asked for.
    if (f.layout != "kv_first" || (!f.decode_layout.empty() && f.decode_layout != "mla"))
      return Bad(fmt::format("--layout: {} is an MLA model; its layout is 'mla'", c.preset.name));
    c.prefill.layout = c.decode.layout = "mla";
  }
  if (f.memory == "host") {
    c.memory = MemoryPlace::kHost;
  } else if (f.memory == "gpu") {
    c.memory = MemoryPlace::kGpu;
  } else {
    return Bad(fmt::format("--memory must be host or gpu, not '{}'", f.memory));
  }
  if (f.compute == "sleep") {
    c.compute = Compute::kSleep;
  } else if (f.compute == "gpu") {
    c.compute = Compute::kGpu;
  } else {
    return Bad(fmt::format("--compute must be sleep or gpu, not '{}'", f.compute));
  }
  if (c.compute == Compute::kGpu && c.memory != MemoryPlace::kGpu)
    return Bad("--compute gpu runs on the KV cache's GPU; it needs --memory gpu");
  if (f.device < 0) return Bad(fmt::format("--device must be 0 or more, not {}", f.device));
  c.device = f.device;
  if (f.transport != "shm" && f.transport != "ucx" && f.transport != "cuda_ipc")
    return Bad(fmt::format("--transport must be shm, ucx or cuda_ipc, not '{}'", f.transport));
  if (f.transport == "shm" && c.memory == MemoryPlace::kGpu)
    return Bad(
        "--transport shm moves host memory only; use --transport cuda_ipc or ucx with --memory "
        "gpu");
  if (f.transport == "cuda_ipc" && c.memory != MemoryPlace::kGpu)
    return Bad("--transport cuda_ipc moves GPU memory only; it needs --memory gpu");
  c.transport = f.transport;
  if (f.mode == "write") {
    c.mode = Mode::kWrite;
  } else if (f.mode == "read") {
    c.mode = Mode::kRead;
  } else {
    return Bad(fmt::format("--mode must be write or read, not '{}'", f.mode));
  }
  if (!(f.rate >= 0 && f.rate <= 1e6))
    return Bad(fmt::format("--rate must be in [0, 1e6] requests/s, not {}", f.rate));
  if (f.trace.empty()) {
    if (f.requests < 1 || f.requests > kMaxRequests)
      return Bad(fmt::format("--requests must be in 1..{}, not {}", kMaxRequests, f.requests));
    FERRY_ASSIGN_OR_RETURN(TokenRange range, ParseTokenRange(f.prompt_tokens));
    c.arrivals = PoissonArrivals(f.requests, f.rate, range, f.seed);
  } else {
    FERRY_ASSIGN_OR_RETURN(std::string text, ReadFile(f.trace));
    FERRY_ASSIGN_OR_RETURN(c.arrivals, ParseTrace(text, f.rate, f.seed));
  }
  if (!(f.layer_us >= 0 && f.layer_us <= 1e7))
    return Bad(fmt::format("--layer-us must be in [0, 1e7] microseconds, not {}", f.layer_us));
  c.layer_time = std::chrono::microseconds(static_cast<int64_t>(std::llround(f.layer_us)));
  FERRY_ASSIGN_OR_RETURN(c.timeout, ParseSeconds(f.timeout_s, "--timeout"));
  FERRY_ASSIGN_OR_RETURN(c.transfer_timeout,
                         ParseSeconds(f.transfer_timeout_s, "--transfer-timeout"));
  c.kill_prefill_after = f.kill_prefill_after;
  c.kill_decode_after = f.kill_decode_after;
  c.stop_prefill_after = f.stop_prefill_after;
  if (!(f.stop_ms >= 0 && f.stop_ms <= 1e7))
    return Bad(fmt::format("--stop-ms must be in [0, 1e7] milliseconds, not {}", f.stop_ms));
  c.stop_time = std::chrono::milliseconds(static_cast<int64_t>(std::llround(f.stop_ms)));
  for (auto [n, flag] : {std::pair{c.kill_prefill_after, "--kill-prefill-after"},
                         std::pair{c.kill_decode_after, "--kill-decode-after"},
                         std::pair{c.stop_prefill_after, "--stop-prefill-after"}})
    if (n >= c.arrivals.size() && n != 0)
      return Bad(
          fmt::format("{} {} must be less than the {} requests", flag, n, c.arrivals.size()));
  if (!(f.prefix_hit >= 0 && f.prefix_hit <= 1))
    return Bad(fmt::format("--prefix-hit must be in [0, 1], not {}", f.prefix_hit));
  c.prefix_hit = f.prefix_hit;
  if (f.blocks > kMaxBlocks) return Bad(fmt::format("--blocks must be at most {}", kMaxBlocks));
  uint64_t longest = 0;
  for (const Arrival& a : c.arrivals) longest = std::max(longest, a.tokens);
  for (SideConfig* s : {&c.prefill, &c.decode}) {
    const uint64_t per_request = (longest + s->block_tokens - 1) / s->block_tokens;
    s->blocks = f.blocks != 0 ? f.blocks : std::max<uint64_t>(64, 8 * per_request);
    if (s->blocks < per_request)
      return Bad(
          fmt::format("--blocks {} cannot hold the longest prompt ({} tokens = {} blocks of {})",
                      s->blocks, longest, per_request, s->block_tokens));
  }
  c.checksums = f.checksums;
  c.busy_poll = f.busy_poll;
  c.json = f.json;
  return c;
}

uint64_t PdConfig::PrefixHitTokens(uint64_t tokens) const {
  const uint64_t l = std::lcm(uint64_t{prefill.block_tokens}, uint64_t{decode.block_tokens});
  if (prefix_hit <= 0 || l == 0) return 0;
  const auto hit = static_cast<uint64_t>(std::floor(prefix_hit * static_cast<double>(tokens)));
  return std::min(tokens, hit / l * l);
}

std::vector<std::string> EngineTransports(const std::string& name) {
  if (name == "cuda_ipc") return {"cuda_ipc", "shm"};
  return {name};
}

std::string Shape(const PdConfig& c) {
  return fmt::format("{}P(dp{}, tp{}, {}) -> {}D(dp{}, tp{}, {}), blocks of {} -> {} tokens{}",
                     c.prefill.instances, c.prefill.dp, c.prefill.tp, c.prefill.layout,
                     c.decode.instances, c.decode.dp, c.decode.tp, c.decode.layout,
                     c.prefill.block_tokens, c.decode.block_tokens,
                     c.prefix_hit > 0 ? fmt::format(", prefix hit {}", c.prefix_hit) : "");
}

std::string InstanceName(bool prefill, uint32_t instance) {
  return fmt::format("{}{}", prefill ? 'p' : 'd', instance);
}

WorkerConfig MakeWorkerConfig(const PdConfig& c, bool prefill, uint32_t instance, uint32_t dp_rank,
                              uint32_t tp_rank) {
  const SideConfig& side = prefill ? c.prefill : c.decode;
  WorkerConfig w;
  w.prefill = prefill;
  w.instance = InstanceName(prefill, instance);
  w.dp_rank = dp_rank;
  w.tp_rank = tp_rank;
  w.tp_size = side.tp;
  w.model = c.preset.name;
  w.layers = c.preset.layers;
  w.block_tokens = side.block_tokens;
  w.layout = side.layout;
  w.blocks = side.blocks;
  w.gpu = c.memory == MemoryPlace::kGpu;
  w.gpu_compute = prefill && c.compute == Compute::kGpu;
  w.device = c.device;
  w.transport = c.transport;
  w.read_mode = c.mode == Mode::kRead;
  w.layer_us = static_cast<uint64_t>(c.layer_time.count());
  w.transfer_timeout_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(c.transfer_timeout).count());
  w.checksums = c.checksums;
  w.busy_poll = c.busy_poll;
  return w;
}

std::string WorkerConfig::ToJson() const {
  nlohmann::json j = {{"prefill", prefill},
                      {"instance", instance},
                      {"dp_rank", dp_rank},
                      {"tp_rank", tp_rank},
                      {"tp_size", tp_size},
                      {"model", model},
                      {"layers", layers},
                      {"block_tokens", block_tokens},
                      {"layout", layout},
                      {"blocks", blocks},
                      {"gpu", gpu},
                      {"gpu_compute", gpu_compute},
                      {"device", device},
                      {"transport", transport},
                      {"read_mode", read_mode},
                      {"layer_us", layer_us},
                      {"transfer_timeout_ms", transfer_timeout_ms},
                      {"checksums", checksums},
                      {"busy_poll", busy_poll}};
  return j.dump();
}

Result<WorkerConfig> WorkerConfig::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad("worker config: not a JSON object");
  WorkerConfig w;
  // Every field must be present with its type; the ranges are checked below.
  auto get = [&](const char* key, auto* out) -> bool {
    auto it = j.find(key);
    if (it == j.end()) return false;
    using T = std::remove_pointer_t<decltype(out)>;
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return false;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return false;
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!it->is_number_unsigned() || it->template get<uint64_t>() > std::numeric_limits<T>::max())
        return false;
    } else {
      if (!it->is_number_integer()) return false;
      const int64_t v = it->template get<int64_t>();
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) return false;
    }
    *out = it->template get<T>();
    return true;
  };
  if (!get("prefill", &w.prefill) || !get("instance", &w.instance) || !get("dp_rank", &w.dp_rank) ||
      !get("tp_rank", &w.tp_rank) || !get("tp_size", &w.tp_size) || !get("model", &w.model) ||
      !get("layers", &w.layers) || !get("block_tokens", &w.block_tokens) ||
      !get("layout", &w.layout) || !get("blocks", &w.blocks) || !get("gpu", &w.gpu) ||
      !get("gpu_compute", &w.gpu_compute) || !get("device", &w.device) ||
      !get("transport", &w.transport) || !get("read_mode", &w.read_mode) ||
      !get("layer_us", &w.layer_us) || !get("transfer_timeout_ms", &w.transfer_timeout_ms) ||
      !get("checksums", &w.checksums) || !get("busy_poll", &w.busy_poll))
    return Bad("worker config: a field is missing or of the wrong type");
  if (w.dp_rank >= kMaxDp || w.layers < 1 || w.layers > kMaxLayers || (w.gpu_compute && !w.gpu) ||
      (w.transport != "shm" && w.transport != "ucx" && w.transport != "cuda_ipc") ||
      w.tp_size < 1 || w.tp_size > kMaxTp || w.tp_rank >= w.tp_size || w.block_tokens < 1 ||
      w.block_tokens > kMaxBlockTokens || w.blocks < 1 || w.blocks > kMaxBlocks ||
      w.instance.empty() || w.instance.size() > 64 || w.device < 0 || w.layer_us > 10'000'000 ||
      w.transfer_timeout_ms < 1 || w.transfer_timeout_ms > 86'400'000)
    return Bad("worker config: a value is out of range");
  return w;
}

}  // namespace ferry::tools::pd
