// The one list of EngineOptions fields that the environment can set (FERRY_*). The parser
// (EngineOptions::FromEnv), the table in docs/configuration.md (checked by options_env_test) and the test that
// every field round-trips are all made from kEnvFields, so none can drift from the others.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "ferry/options.h"
#include "ferry/status.h"

namespace ferry {

enum class EnvKind {
  kString,        // taken as is
  kList,          // comma-separated names
  kUids,          // comma-separated user ids (numbers)
  kBool,          // 0, 1, true, false (any case)
  kCount,         // a non-negative integer
  kInt,           // an integer (may be negative)
  kBytes,         // a non-negative integer, with an optional K, M or G (binary: 1K = 1024)
  kDuration,      // milliseconds, or a number with us, ms, s or min
  kOptDuration,   // as kDuration; empty = unset
  kEnum,          // one of the names in the description
};

struct EnvField {
  std::string_view variable;  // FERRY_UCX_LISTEN_HOST
  std::string_view field;     // ucx.listen_host (the C++ member)
  EnvKind kind;
  std::string_view values;    // what the value may be, for the table
  // Parses `value` into the field; kInvalidArgument (without the variable's name: the caller
  // adds it) on a bad value.
  Status (*set)(EngineOptions& o, std::string_view value);
  // The field's value in the form `set` reads.
  std::string (*get)(const EngineOptions& o);
};

std::span<const EnvField> EnvFields();

// Reads each variable through `lookup` (null = unset). The first bad value is an error naming
// its variable.
Result<EngineOptions> OptionsFromLookup(EngineOptions base, const char* (*lookup)(const char*));

// The table of the variables in docs/configuration.md (markdown, one row a field).
std::string EnvTableMarkdown();

}  // namespace ferry
