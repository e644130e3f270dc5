// What `ferry`'s servers (bench --listen, embed-serve) offer for watching them: the in-flight
// dump on SIGUSR1 and a --metrics-port option.
//
// InFlightDump: while it lives, SIGUSR1 makes a thread of its own print the engine's in-flight
// transfers (ferry::RenderInFlight) to `out` (stderr by default). The signal handler only
// writes a byte to a pipe, which is all a handler may safely do; the dump is made on the
// thread, so a stuck deployment can be read with `kill -USR1 <pid>`. One at a time a process
// (Start refuses a second with kFailedPrecondition).
//
// Thread safety: Start and the destructor from one thread; the engine outlives the dump.
#pragma once

#include <cstdio>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>

#include "ferry/engine.h"

namespace ferry::tools {

class InFlightDump {
 public:
  static Result<std::unique_ptr<InFlightDump>> Start(const Engine* engine, std::FILE* out = stderr);
  ~InFlightDump();  // restores SIGUSR1's previous action

  // Dumps printed so far (for tests).
  int dumps() const { return dumps_.load(); }

 private:
  InFlightDump() = default;
  void Run();

  const Engine* engine_ = nullptr;
  std::FILE* out_ = nullptr;
  int pipe_[2] = {-1, -1};
  std::atomic<int> dumps_{0};
  std::thread thread_;
};

// Adds --metrics-port to a server command: EngineOptions::metrics_port (0 off, -1 any free
// port; the server prints the port it serves GET /metrics on).
void AddMetricsPortOption(CLI::App* command, int* port);

}  // namespace ferry::tools
