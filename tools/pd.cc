// `ferry pd`: a prefill/decode (P/D) simulator that shows the KV connector (ferry/kv.h) doing
// its job. N prefill and M decode instances (each of DP ranks of TP ranks, one process per
// rank) run on this host; requests arrive (Poisson or a trace), prefill computes each layer (a
// stand-in of a given time: a sleep, or a kernel on the GPU) and hands its KV to decode through
// the connector, in write or read mode, after any prefix the decode side already holds; every
// decode rank checks every byte it received, and the run ends with a summary. Fault runs kill a
// prefill or a decode worker mid-request. `ferry pd-worker` is the hidden command each worker
// process runs.
#include <fmt/format.h>
#include <signal.h>

#include <cstdlib>
#include <memory>

#include "commands.h"
#include "ferry/gpu.h"
#include "ferry/kv.h"
#include "pd_config.h"
#include "pd_router.h"
#include "pd_worker.h"

namespace ferry::tools {
namespace {

constexpr std::string_view kCmd = "pd";

// What the connector's names say about the layouts, checked before any process starts.
Status CheckLayouts(const pd::PdConfig& c) {
  for (const auto* side : {&c.prefill, &c.decode}) {
    const std::string_view flag = side == &c.prefill ? "--layout" : "--decode-layout";
    auto order = kv::ParseTensorOrder(side->layout);
    if (!order.ok())
      return Status(Code::kInvalidArgument, fmt::format("{}: {}", flag, order.status().message()));
    if ((*order == kv::TensorOrder::kMla) != c.preset.mla)
      return Status(Code::kInvalidArgument,
                    fmt::format("{} {}: {} {} an MLA model", flag, side->layout, c.preset.name,
                                c.preset.mla ? "is" : "is not"));
  }
  return Status::Ok();
}

int Run(const pd::PdFlags& f) {
  auto config = pd::Configure(f);
  if (!config.ok()) return Fail(kCmd, config.status());
  if (Status s = CheckLayouts(*config); !s.ok()) return Fail(kCmd, s);
  std::string reason;
  if (config->memory == pd::MemoryPlace::kGpu && !gpu::Available(&reason))
    return Fail(kCmd, Status(Code::kUnsupported, "--memory gpu: no usable GPU: " + reason));
  signal(SIGPIPE, SIG_IGN);
  return pd::RunRouter(*config);
}

}  // namespace

void AddPdCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("pd",
                                     "Simulate prefill/decode disaggregation: workers hand KV over "
                                     "the connector, every byte verified");
  // A flag given twice takes its last value, so scripts can append to a common set.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto f = std::make_shared<pd::PdFlags>();
  std::string models;
  for (const pd::Preset& p : pd::Presets()) models += fmt::format("\n  {}: {}", p.name, p.about);
  cmd->add_option("--model", f->model, "Model preset:" + models)->capture_default_str();
  cmd->add_option("--layers", f->layers,
                  "Layers of the model (0: the preset's): its shape with fewer or more layers")
      ->capture_default_str();
  cmd->add_option("--prefill", f->prefill, "Prefill instances")->capture_default_str();
  cmd->add_option("--decode", f->decode, "Decode instances")->capture_default_str();
  cmd->add_option("--prefill-tp", f->prefill_tp, "TP ranks (processes) of each prefill instance")
      ->capture_default_str();
  cmd->add_option("--decode-tp", f->decode_tp, "TP ranks (processes) of each decode instance")
      ->capture_default_str();
  cmd->add_option("--prefill-dp", f->prefill_dp,
                  "DP ranks of each prefill instance (each of --prefill-tp ranks, its own blocks)")
      ->capture_default_str();
  cmd->add_option("--decode-dp", f->decode_dp,
                  "DP ranks of each decode instance (each of --decode-tp ranks, its own blocks)")
      ->capture_default_str();
  cmd->add_option("--block-tokens", f->block_tokens, "Tokens a block (0: the preset's)")
      ->capture_default_str();
  cmd->add_option("--decode-block-tokens", f->decode_block_tokens,
                  "Decode side's tokens a block (0: --block-tokens)")
      ->capture_default_str();
  cmd->add_option("--layout", f->layout,
                  "KV tensor order: kv_first, kv_first_hnd, blocks_first, blocks_first_hnd, "
                  "separate, separate_hnd "
                  "(MLA models: mla)")
      ->capture_default_str();
  cmd->add_option("--decode-layout", f->decode_layout,
                  "Decode side's tensor order (default: --layout)");
  cmd->add_option("--memory", f->memory, "KV caches in host or gpu memory")->capture_default_str();
  cmd->add_option("--compute", f->compute,
                  "Prefill's per-layer compute stand-in: sleep (CPU) or gpu (a kernel spinning "
                  "--layer-us on the GPU; the layer's write waits for it; needs --memory gpu)")
      ->capture_default_str();
  cmd->add_option("--device", f->device, "GPU for --memory gpu")->capture_default_str();
  cmd->add_option("--transport", f->transport,
                  "Engine transport: shm or ucx (host memory); cuda_ipc or ucx (--memory gpu)")
      ->capture_default_str();
  cmd->add_option("--mode", f->mode, "write (prefill pushes each layer) or read (decode pulls)")
      ->capture_default_str();
  cmd->add_option("--requests", f->requests, "Requests (without --trace)")->capture_default_str();
  cmd->add_option("--rate", f->rate, "Poisson arrivals per second (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", f->prompt_tokens, "Prompt length N or MIN..MAX (uniform)")
      ->capture_default_str();
  cmd->add_option("--trace", f->trace,
                  "File of prompt lengths, one a line: TOKENS or SECONDS TOKENS");
  cmd->add_option("--layer-us", f->layer_us,
                  "Compute stand-in per layer, microseconds (see --compute)")
      ->capture_default_str();
  cmd->add_option("--blocks", f->blocks,
                  "KV blocks of each worker (0: 8 longest prompts, at least 64)")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of arrivals and prompt lengths")->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Seconds the whole run may take")
      ->capture_default_str();
  cmd->add_option("--transfer-timeout", f->transfer_timeout_s,
                  "Seconds a request's KV may take to arrive")
      ->capture_default_str();
  cmd->add_option("--kill-prefill-after", f->kill_prefill_after,
                  "Fault run: SIGKILL a prefill worker after N requests ended (0: never)")
      ->capture_default_str();
  cmd->add_option("--kill-decode-after", f->kill_decode_after,
                  "Fault run: SIGKILL a decode worker with a request in flight after N requests "
                  "ended (0: never)")
      ->capture_default_str();
  cmd->add_option("--stop-prefill-after", f->stop_prefill_after,
                  "Fault run: SIGSTOP a prefill worker after N requests ended (0: never)")
      ->capture_default_str();
  cmd->add_option("--stop-ms", f->stop_ms,
                  "How long --stop-prefill-after keeps it stopped before SIGCONT, ms (0: until "
                  "the run ends)")
      ->capture_default_str();
  cmd->add_option("--prefix-hit", f->prefix_hit,
                  "Share of each prompt the decode side already holds (0..1; whole blocks of "
                  "both sides): only the rest moves")
      ->capture_default_str();
  cmd->add_flag("--checksums", f->checksums, "Per-layer checksums in the connector");
  cmd->add_flag("--busy-poll", f->busy_poll,
                "Connector threads poll instead of sleeping while requests are open (lowest latency, a core each)");
  cmd->add_flag("--json", f->json, "Print the summary as one JSON object");
  cmd->callback([f, exit_code] { *exit_code = Run(*f); });

  // The worker side, started by `ferry pd` itself; hidden from --help.
  CLI::App* worker = app.add_subcommand("pd-worker", "A `ferry pd` worker (started by `ferry pd`)");
  worker->group("");
  auto fd = std::make_shared<int>(-1);
  worker->add_option("--fd", *fd, "The router's channel")->required();
  worker->callback([fd, exit_code] {
    signal(SIGPIPE, SIG_IGN);
    *exit_code = pd::RunWorker(*fd);
  });
}

}  // namespace ferry::tools
