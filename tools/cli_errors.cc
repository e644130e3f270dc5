#include "cli_errors.h"

#include <fmt/format.h>

#include <cctype>
#include <vector>

namespace ferry::tools {
namespace {

// The visible commands, by name (hidden ones, such as pd-worker, have no group).
std::vector<std::string> CommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (!sub->get_group().empty()) names.push_back(sub->get_name());
  return names;
}

bool IsCommand(const CLI::App& app, const std::string& word) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name() == word) return true;
  return false;
}

}  // namespace

std::string ParseErrorLine(const CLI::App& app, const CLI::ParseError& e,
                           const std::string& first_arg) {
  const std::vector<std::string> commands = CommandNames(app);
  if (!first_arg.empty() && first_arg[0] != '-' && !IsCommand(app, first_arg))
    return fmt::format("ferry: unknown command '{}' (commands: {}; see `ferry --help`)", first_arg,
                       fmt::join(commands, ", "));
  // The command being parsed when the error came, when there was one.
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  const std::string command = chosen.empty() ? "" : chosen.front()->get_name();
  std::string what = e.what();
  if (what == "A subcommand is required" || what.starts_with("A subcommand is required"))
    what = fmt::format("a command is required ({})", fmt::join(commands, ", "));
  // CLI11's messages span lines at times; an error is one line.
  for (char& c : what)
    if (c == '\n') c = ' ';
  while (!what.empty() && what.back() == ' ') what.pop_back();
  // "The following argument ..." reads as the rest of a line: "ferry bench: the following ...".
  if (what.size() > 1 && std::isupper(static_cast<unsigned char>(what[0])) &&
      std::islower(static_cast<unsigned char>(what[1])))
    what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  if (command.empty()) return fmt::format("ferry: {} (see `ferry --help`)", what);
  return fmt::format("ferry {}: {} (see `ferry {} --help`)", command, what, command);
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, const char* const* argv,
                                    std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    // --help and --version: CLI11 prints them (the help of the command asked about) to `out`.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e, out, err);
    err << ParseErrorLine(app, e, argc > 1 ? std::string(argv[1]) : std::string()) << "\n";
    return kUsageExit;
  }
}

}  // namespace ferry::tools
