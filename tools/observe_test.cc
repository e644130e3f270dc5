#include "observe.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace ferry::tools {
namespace {

TEST(InFlightDump, Sigusr1PrintsTheInFlightTransfersFromItsThread) {
  EngineOptions o;
  o.transports = {"local"};
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  auto dump = InFlightDump::Start(engine->get(), out);
  ASSERT_TRUE(dump.ok()) << dump.status().ToString();
  EXPECT_EQ(InFlightDump::Start(engine->get(), out).status().code(), Code::kFailedPrecondition);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((*dump)->dumps() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ((*dump)->dumps(), 1);
  dump->reset();
  std::rewind(out);
  char buf[256] = {};
  ASSERT_NE(std::fgets(buf, sizeof(buf), out), nullptr);
  EXPECT_EQ(std::string(buf), "ferry: 0 transfer(s) in flight\n");
  std::fclose(out);
  // Removed: a new one may start.
  auto again = InFlightDump::Start(engine->get(), stderr);
  EXPECT_TRUE(again.ok());
}

}  // namespace
}  // namespace ferry::tools
