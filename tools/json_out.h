// `--json [FILE]`, the same on every command that reports figures: the report as one JSON
// document in FILE, or on standard output when FILE is `-` or left out. When the JSON goes to
// standard output the command's text report goes to standard error, so that standard output
// holds the document alone (`ferry bench --json - | jq`).
//
// Thread safety: none; a command's flags are used by the thread that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::tools {

struct JsonFlag {
  std::string path;               // as given; empty when given without one
  CLI::Option* option = nullptr;  // set by AddJsonFlag

  bool given() const { return option != nullptr && option->count() > 0; }
  bool to_stdout() const { return given() && (path.empty() || path == "-"); }
};

// Adds `--json [FILE]` to `cmd`; `what` says what the document holds.
void AddJsonFlag(CLI::App* cmd, JsonFlag* flag, std::string_view what);

// Checks, before a long run, that the document can be written where asked: the folder exists
// and the file, if there, is a regular file this process may write. kInvalidArgument otherwise.
Status CheckJsonTarget(const JsonFlag& flag);

// Where the text report goes: stderr when the JSON takes stdout, else stdout.
std::FILE* TextStream(const JsonFlag& flag);

// Writes `doc` (indented, one trailing newline) where `flag` says; nothing when not given.
Status WriteJson(const JsonFlag& flag, const nlohmann::ordered_json& doc);

}  // namespace ferry::tools
