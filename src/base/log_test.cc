#include "base/log.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace ferry {
namespace {

// Captures the log while alive; restores stderr and the level it found.
class CaptureLog {
 public:
  CaptureLog() : level_(GetLogLevel()) {
    SetLogSink([this](LogLevel l, std::string_view m) { seen.emplace_back(l, std::string(m)); });
  }
  ~CaptureLog() {
    SetLogSink(nullptr);
    (void)SetLogLevel(level_);
  }
  std::vector<std::pair<LogLevel, std::string>> seen;

 private:
  std::string level_;
};

TEST(LogTest, EnvValueSetsTheLevel) {
  CaptureLog capture;
  ApplyLogEnv("debug");
  EXPECT_EQ(GetLogLevel(), "debug");
  ApplyLogEnv("ERROR");
  EXPECT_EQ(GetLogLevel(), "error");
  ApplyLogEnv("warning");
  EXPECT_EQ(GetLogLevel(), "warn");
  EXPECT_TRUE(capture.seen.empty());
}

TEST(LogTest, BadEnvValueWarnsAndKeepsTheLevel) {
  CaptureLog capture;
  ASSERT_TRUE(SetLogLevel("info").ok());
  ApplyLogEnv("loud");
  EXPECT_EQ(GetLogLevel(), "info");
  ASSERT_EQ(capture.seen.size(), 1u);
  EXPECT_EQ(capture.seen[0].first, LogLevel::kWarn);
  EXPECT_NE(capture.seen[0].second.find("FERRY_LOG=loud"), std::string::npos) << capture.seen[0].second;
}

TEST(LogTest, UnsetEnvChangesNothing) {
  CaptureLog capture;
  ASSERT_TRUE(SetLogLevel("error").ok());
  ApplyLogEnv(nullptr);
  EXPECT_EQ(GetLogLevel(), "error");
}

TEST(LogTest, SetLogLevelRefusesUnknownNames) {
  CaptureLog capture;
  ASSERT_TRUE(SetLogLevel("trace").ok());
  Status s = SetLogLevel("verbose");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(GetLogLevel(), "trace");
}

TEST(LogTest, SinkReceivesMessagesAtOrAboveTheLevel) {
  CaptureLog capture;
  ASSERT_TRUE(SetLogLevel("warn").ok());
  FERRY_LOG_INFO("hidden {}", 1);
  FERRY_LOG_WARN("shown {}", 2);
  FERRY_LOG_ERROR("shown {}", 3);
  ASSERT_EQ(capture.seen.size(), 2u);
  EXPECT_EQ(capture.seen[0], std::make_pair(LogLevel::kWarn, std::string("shown 2")));
  EXPECT_EQ(capture.seen[1], std::make_pair(LogLevel::kError, std::string("shown 3")));
}

TEST(LogTest, ParseAndNameRoundTrip) {
  for (LogLevel l : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError,
                     LogLevel::kOff}) {
    Result<LogLevel> parsed = ParseLogLevel(LogLevelName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
}

}  // namespace
}  // namespace ferry
