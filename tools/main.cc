// `ferry`: the command-line front end (info, bench, demo, pd, embed-serve, bench-embed, metrics). Exit
// status: 0 success, 1 a failed operation or check, 2 bad usage (a parse error included).
// Logging: the library reads FERRY_LOG ("debug", "info", "warn", ...) itself; --log-level,
// given before the command, overrides it.
#include <fmt/format.h>

#include <iostream>

#include "cli_errors.h"
#include "commands.h"
#include "ferry/engine.h"
#include "ferry/log.h"
#include "ferry/status.h"

namespace ferry::tools {

int Fail(std::string_view command, const Status& status) {
  fmt::print(stderr, "ferry {}: {}\n", command, status.ToString());
  return status.code() == Code::kInvalidArgument ? 2 : 1;
}

}  // namespace ferry::tools

int main(int argc, char** argv) {
  CLI::App app{"ferry: moves LLM inference state (KV caches) between GPUs, processes and hosts"};
  app.set_version_flag("--version", std::string(ferry::Version()));
  // Applied while parsing, before any command runs; a bad name is bad usage (exit 2).
  app.add_option_function<std::string>(
         "--log-level",
         [](const std::string& level) {
           if (ferry::Status s = ferry::SetLogLevel(level); !s.ok())
             throw CLI::ValidationError("--log-level", std::string(s.message()));
         },
         "trace, debug, info, warn, error or off (default: FERRY_LOG, else warn)");
  app.require_subcommand(1);
  int exit_code = 0;
  ferry::tools::AddInfoCommand(app, &exit_code);
  ferry::tools::AddBenchCommand(app, &exit_code);
  ferry::tools::AddDemoCommand(app, &exit_code);
  ferry::tools::AddEmbedServeCommand(app, &exit_code);
  ferry::tools::AddEmbedBenchCommand(app, &exit_code);
  ferry::tools::AddPdCommand(app, &exit_code);
  ferry::tools::AddMetricsCommand(app, &exit_code);
  // Not CLI11_PARSE: its exit codes (105, 106, 109, ...) are not the documented 2 of bad usage.
  if (std::optional<int> parse_exit = ferry::tools::ParseCommandLine(app, argc, argv, std::cout, std::cerr))
    return *parse_exit;
  return exit_code;
}
