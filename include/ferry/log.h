// ferry's log level, for programs and libraries that embed ferry. ferry's messages go to one
// logger named "ferry" (spdlog, stderr); its level is set once, at the edge: the `ferry` CLI
// reads FERRY_LOG, an embedding program calls SetLogLevel.
//
// Thread safety: SetLogLevel may be called from any thread, at any time.
#pragma once

#include <string_view>

namespace ferry {

// "trace", "debug", "info", "warn", "error", "off"; unknown names keep the current level.
void SetLogLevel(std::string_view level);

}  // namespace ferry
