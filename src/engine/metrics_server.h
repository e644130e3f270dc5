// MetricsServer: a tiny HTTP server for GET /metrics (EngineOptions::metrics_port).
//
// One thread, one connection at a time: it accepts a connection, reads at most
// kMaxRequestBytes within kRequestTimeout (a client that stalls is dropped), answers GET
// /metrics with 200 and the text `render` gives, any other GET with 404, anything else with
// 400, within kResponseTimeout (a client that stops reading is dropped), and closes the
// connection. It listens on 127.0.0.1 only. Stopping (the destructor) ends any wait at once.
//
// Thread safety: Start and the destructor from one thread; `render` runs on the server's.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "ferry/status.h"

namespace ferry::internal {

class MetricsServer {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr std::chrono::milliseconds kRequestTimeout{1000};
  static constexpr std::chrono::milliseconds kResponseTimeout{2000};

  // `port`: 0 picks a free one. kUnavailable when it cannot listen there.
  static Result<std::unique_ptr<MetricsServer>> Start(int port, std::function<std::string()> render);
  ~MetricsServer();  // stops the thread and closes the socket
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  void Run();
  void Serve(int fd);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor writes to stop the thread
  int port_ = 0;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace ferry::internal
