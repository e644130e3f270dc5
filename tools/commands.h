// The subcommands of the `ferry` tool. Each registers its options on `app` and runs from the
// subcommand's callback, leaving the process exit status in *exit_code:
// 0 success, 1 a failed operation or check (the ferry::Status is printed), 2 bad usage.
#pragma once

#include <CLI/CLI.hpp>
#include <string_view>

#include "ferry/status.h"

namespace ferry::tools {

void AddInfoCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddDemoCommand(CLI::App& app, int* exit_code);
void AddEmbedServeCommand(CLI::App& app, int* exit_code);
void AddEmbedBenchCommand(CLI::App& app, int* exit_code);
// `ferry pd` and the hidden `ferry pd-worker` it starts.
void AddPdCommand(CLI::App& app, int* exit_code);
// `ferry metrics`: print a running engine's /metrics, or serve several engines' merged.
void AddMetricsCommand(CLI::App& app, int* exit_code);

// Prints "ferry <command>: <status>" on stderr and returns the exit status for it.
int Fail(std::string_view command, const Status& status);

}  // namespace ferry::tools
