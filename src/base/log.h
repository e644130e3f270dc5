// Logging: ferry's messages go through one spdlog logger named "ferry". The level is set once,
// at the edge (the CLI reads FERRY_LOG; libraries embedding ferry call SetLogLevel).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "ferry/log.h"

namespace ferry {

spdlog::logger& Log();
// SetLogLevel: ferry/log.h.

}  // namespace ferry

#define FERRY_LOG_DEBUG(...) ::ferry::Log().debug(__VA_ARGS__)
#define FERRY_LOG_INFO(...) ::ferry::Log().info(__VA_ARGS__)
#define FERRY_LOG_WARN(...) ::ferry::Log().warn(__VA_ARGS__)
#define FERRY_LOG_ERROR(...) ::ferry::Log().error(__VA_ARGS__)
