// How the `ferry` command line is parsed: a parse error (an unknown flag or command, a bad or
// missing value) is one readable line on stderr and exit status 2, commands.h's "bad usage",
// whatever CLI11's own exit code for it would be (105, 106, 109, ...). --help and --version
// are not errors: their text goes to `out` and the status is 0.
//
// Thread safety: none; called once, from main.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <ostream>
#include <string>

namespace ferry::tools {

// The exit status of bad usage.
inline constexpr int kUsageExit = 2;

// Parses `argv` into `app`, which runs the chosen command's callback. nullopt when the line
// parsed (the command's own exit status stands); otherwise the exit status to return, after
// the help, the version or the error line has been written.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, const char* const* argv,
                                    std::ostream& out, std::ostream& err);

// The one line a parse error prints: "ferry bench: --op: foo not in {write,read} (see `ferry
// bench --help`)". `first_arg` is argv[1] (empty when there is none): a word that names no
// command is said to be an unknown command.
std::string ParseErrorLine(const CLI::App& app, const CLI::ParseError& e,
                           const std::string& first_arg);

}  // namespace ferry::tools
