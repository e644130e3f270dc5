#include "base/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace ferry {
namespace {

// The logger's one sink: stderr, or the application's LogSink. The callback is copied under a
// lock and called without it (spdlog's own sink mutex is a null_mutex here): a sink that waits
// for Python's GIL must not hold anything another logging thread needs, or a thread that holds
// the GIL and logs would wait for that thread forever.
class SwitchSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  SwitchSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()) {
    stderr_->set_pattern("[%H:%M:%S.%e] [ferry] [%^%l%$] %v");
  }

  void Set(LogSink sink) {
    std::shared_ptr<const LogSink> next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
    std::lock_guard lock(mu_);
    callback_ = std::move(next);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::shared_ptr<const LogSink> callback;
    {
      std::lock_guard lock(mu_);
      callback = callback_;
    }
    if (!callback) {
      stderr_->log(msg);
      return;
    }
    (*callback)(FromSpdlog(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override { stderr_->flush(); }

 private:
  static LogLevel FromSpdlog(spdlog::level::level_enum l) {
    switch (l) {
      case spdlog::level::trace: return LogLevel::kTrace;
      case spdlog::level::debug: return LogLevel::kDebug;
      case spdlog::level::info: return LogLevel::kInfo;
      case spdlog::level::warn: return LogLevel::kWarn;
      case spdlog::level::off: return LogLevel::kOff;
      default: return LogLevel::kError;  // err, critical
    }
  }

  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> stderr_;
  std::mutex mu_;
  std::shared_ptr<const LogSink> callback_;  // guarded by mu_
};

spdlog::level::level_enum ToSpdlog(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

void ApplyLogEnvTo(spdlog::logger& logger, const char* value) {
  if (value == nullptr) return;
  Result<LogLevel> level = ParseLogLevel(value);
  if (level.ok()) {
    logger.set_level(ToSpdlog(*level));
  } else {
    logger.warn("FERRY_LOG={}: {}; the level stays {}", value, level.status().message(),
                spdlog::level::to_string_view(logger.level()));
  }
}

struct Logger {
  std::shared_ptr<SwitchSink> sink = std::make_shared<SwitchSink>();
  // Not in spdlog's registry: an application's own logger named "ferry" must not clash.
  std::shared_ptr<spdlog::logger> logger = std::make_shared<spdlog::logger>("ferry", sink);
  Logger() {
    logger->set_level(spdlog::level::warn);
    ApplyLogEnvTo(*logger, std::getenv("FERRY_LOG"));
  }
};

Logger& TheLogger() {
  // Never destroyed: threads may still log while static destructors run at exit.
  static Logger* l = new Logger();
  return *l;
}

}  // namespace

spdlog::logger& Log() { return *TheLogger().logger; }

void ApplyLogEnv(const char* value) { ApplyLogEnvTo(Log(), value); }

Result<LogLevel> ParseLogLevel(std::string_view level) {
  std::string s(level);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  if (s == "off") return LogLevel::kOff;
  return Status(Code::kInvalidArgument,
                "unknown log level \"" + std::string(level.substr(0, 64)) +
                    "\" (trace, debug, info, warn, error, off)");
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "warn";
}

Status SetLogLevel(std::string_view level) {
  FERRY_ASSIGN_OR_RETURN(LogLevel l, ParseLogLevel(level));
  Log().set_level(ToSpdlog(l));
  return Status::Ok();
}

std::string_view GetLogLevel() {
  switch (Log().level()) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::off: return "off";
    default: return "error";
  }
}

void SetLogSink(LogSink sink) { TheLogger().sink->Set(std::move(sink)); }

}  // namespace ferry
