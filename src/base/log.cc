#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ferry {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("ferry");
    l->set_level(spdlog::level::warn);
    l->set_pattern("[%H:%M:%S.%e] [ferry] [%^%l%$] %v");
    return l;
  }();
  return *logger;
}

void SetLogLevel(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed != spdlog::level::off || level == "off") Log().set_level(parsed);
}

}  // namespace ferry
