// Logging: ferry's messages go through one spdlog logger named "ferry". Its level starts from
// FERRY_LOG, read once when the logger is first used (ferry/log.h has the public calls).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "ferry/log.h"

namespace ferry {

spdlog::logger& Log();
// SetLogLevel, GetLogLevel, SetLogSink: ferry/log.h.

// What the first use of Log() does with FERRY_LOG's value (null: unset): a known level is set;
// an unknown one leaves the level as it was and logs a warning that names the variable.
// Exposed for tests.
void ApplyLogEnv(const char* value);

}  // namespace ferry

#define FERRY_LOG_DEBUG(...) ::ferry::Log().debug(__VA_ARGS__)
#define FERRY_LOG_INFO(...) ::ferry::Log().info(__VA_ARGS__)
#define FERRY_LOG_WARN(...) ::ferry::Log().warn(__VA_ARGS__)
#define FERRY_LOG_ERROR(...) ::ferry::Log().error(__VA_ARGS__)
