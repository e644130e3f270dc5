// `ferry info`: what this build can do here (ferry::Probe()), as text or JSON.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "ferry/options.h"
#include "ferry/system.h"
#include "json_out.h"
#include "units.h"

namespace ferry::tools {
namespace {

std::string Join(const std::vector<std::string>& items) {
  return items.empty() ? "(none)" : fmt::format("{}", fmt::join(items, ", "));
}

// Whether this environment gives engines a secret (FERRY_SECRET, FERRY_SECRET_FILE): then their
// ucx peers must prove they hold it. The secret itself is never printed.
bool PeersAuthenticated() {
  auto env = EngineOptions::FromEnv();
  return env.ok() && (!env->secret.empty() || !env->secret_file.empty());
}

nlohmann::ordered_json ToJson(const SystemInfo& info) {
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const GpuInfo& g : info.gpus) {
    gpus.push_back({{"ordinal", g.ordinal},
                    {"name", g.name},
                    {"memory_bytes", g.memory_bytes},
                    {"compute_capability", fmt::format("{}.{}", g.sm_major, g.sm_minor)},
                    {"kernels", g.kernels}});
  }
  nlohmann::ordered_json transports = nlohmann::ordered_json::array();
  for (const TransportInfo& t : info.transports) {
    transports.push_back({{"name", t.name},
                          {"host_memory", t.host_memory},
                          {"cuda_memory", t.cuda_memory},
                          {"notifications", t.notifications},
                          {"reach", t.reach}});
  }
  return {{"version", info.version},
          {"transports_compiled", info.transports_compiled},
          {"transports_usable", info.transports_usable},
          {"transports", transports},
          {"cuda_built", info.cuda_built},
          {"cuda_available", info.cuda_available},
          {"cuda_unavailable_reason", info.cuda_unavailable_reason},
          {"cuda_architectures", info.cuda_architectures},
          {"gpus", gpus},
          {"peers_authenticated", PeersAuthenticated()}};
}

void PrintText(const SystemInfo& info) {
  fmt::print("peer authentication: {}\n", PeersAuthenticated()
                                               ? "on (FERRY_SECRET / FERRY_SECRET_FILE): ucx peers prove the secret"
                                               : "off: peers are not authenticated (set FERRY_SECRET or "
                                                 "EngineOptions::secret)");
  fmt::print("ferry {}\n", info.version);
  fmt::print("transports compiled: {}\n", Join(info.transports_compiled));
  fmt::print("transports usable:   {}\n", Join(info.transports_usable));
  for (const TransportInfo& t : info.transports) {
    std::vector<std::string> carries;
    if (t.host_memory) carries.emplace_back("host");
    if (t.cuda_memory) carries.emplace_back("cuda");
    fmt::print("  {:<9} reach {:<8} memory {:<10} notifications {}\n", t.name, t.reach, Join(carries),
               t.notifications ? "own" : "through another transport");
  }
  if (info.cuda_built) {
    fmt::print("cuda built:          yes, kernels for {}\n", info.cuda_architectures_described);
  } else {
    fmt::print("cuda built:          no\n");
  }
  if (info.cuda_available) {
    fmt::print("cuda available:      yes\n");
  } else {
    fmt::print("cuda available:      no ({})\n", info.cuda_unavailable_reason);
  }
  fmt::print("gpus:                {}\n", info.gpus.size());
  for (const GpuInfo& g : info.gpus) {
    fmt::print("  [{}] {}, {}, sm_{}{}, kernels: {}\n", g.ordinal, g.name, FormatBytes(g.memory_bytes),
               g.sm_major, g.sm_minor, g.kernels);
  }
}

}  // namespace

void AddInfoCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("info", "Version, transports, CUDA and GPUs seen here");
  auto json = std::make_shared<JsonFlag>();
  AddJsonFlag(cmd, json.get(), "What was found");
  cmd->callback([json, exit_code] {
    if (Status s = CheckJsonTarget(*json); !s.ok()) {
      *exit_code = Fail("info", s);
      return;
    }
    SystemInfo info = Probe();
    // With --json the document replaces the text (`ferry info --json` prints JSON alone); with
    // --json FILE the text is printed too.
    if (!json->to_stdout()) PrintText(info);
    Status s = WriteJson(*json, ToJson(info));
    *exit_code = s.ok() ? 0 : Fail("info", s);
  });
}

}  // namespace ferry::tools
