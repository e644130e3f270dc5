// ferry's log, for programs and libraries that embed ferry. ferry's messages go to one logger
// named "ferry" (spdlog), on stderr by default. Its level starts at "warn", or at FERRY_LOG
// when that variable is set: the library reads it itself, once, when it first logs or is asked
// for its level, so a program embedding ferry gets it without code. SetLogLevel changes it later.
// SetLogSink sends the messages elsewhere (ferry's Python module forwards them to Python's
// `logging` this way).
//
// Thread safety: every function may be called from any thread, at any time.
#pragma once

#include <functional>
#include <string_view>

#include "ferry/status.h"

namespace ferry {

enum class LogLevel : int { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// "trace", "debug", "info", "warn" (or "warning"), "error", "off", in any case. An unknown name
// is kInvalidArgument and leaves the level as it was.
Status SetLogLevel(std::string_view level);
// The current level's name, one of those above ("warning" is reported as "warn").
std::string_view GetLogLevel();
// The level of a name as SetLogLevel reads it, or kInvalidArgument.
Result<LogLevel> ParseLogLevel(std::string_view level);
std::string_view LogLevelName(LogLevel level);

// Receives each message at or above the level, already formatted (without time or level),
// on the thread that logs it: an engine's own threads as well as callers'. It must not call
// back into ferry's log, and it is not called with any ferry lock of the log held, so it may
// block (e.g. on Python's GIL) without stopping other threads from logging.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;
// Replaces stderr with `sink`; an empty function restores stderr.
void SetLogSink(LogSink sink);

}  // namespace ferry
