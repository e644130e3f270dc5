// What `ferry metrics` and `ferry embed-serve --metrics-port` need to read and serve Prometheus
// text over HTTP, with only ferry's public headers: a bounded GET client, a parser of the text
// exposition into samples, a merger of several engines' texts into one, and a tiny server.
//
// Addresses are "host:port", "[v6]:port" or "http://host:port/path" (path default /metrics);
// host is an IPv4 or IPv6 address or a name (getaddrinfo). Every read is bounded in size and
// time: a peer that stalls or sends too much is an error, never a hang or a crash.
//
// Thread safety: the free functions from any thread; MetricsHttpServer as its comment says.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools {

inline constexpr size_t kMaxMetricsResponseBytes = 64 << 20;
inline constexpr size_t kMaxMetricsRequestBytes = 8192;

struct MetricsUrl {
  std::string host;  // without brackets
  uint16_t port = 0;
  std::string path = "/metrics";
};

// kInvalidArgument names the address and what is wrong with it.
Result<MetricsUrl> ParseMetricsUrl(std::string_view text);

// GET url.path from url within `timeout` (connecting included). kUnavailable when nothing
// answers or the answer is not 200; kDeadlineExceeded past the timeout; kResourceExhausted
// past kMaxMetricsResponseBytes; kInvalidArgument for an answer that is not HTTP.
Result<std::string> FetchMetrics(const MetricsUrl& url, std::chrono::milliseconds timeout);

// The samples of a Prometheus text exposition: "name{labels}" (as written) -> value. Comments
// and blank lines are skipped; kInvalidArgument names the first malformed line.
Result<std::map<std::string, double>> ParsePrometheusSamples(std::string_view text);

// One target's scrape: its text, or why there is none.
struct Scrape {
  std::string target;
  Status status;
  std::string text;
};

// One exposition of every scrape's samples: each metric family (its # HELP and # TYPE lines
// once, from the first text that has them) followed by its samples from every text, in order;
// a sample repeated verbatim by a later text is dropped. Ends with the gauge
// ferry_metrics_target_up{target="..."} (1 scraped, 0 not) so that a dead rank is visible.
std::string MergePrometheus(const std::vector<Scrape>& scrapes);

// A tiny HTTP server for GET /metrics (and GET /), one thread, one connection at a time: it
// reads at most kMaxMetricsRequestBytes within one second, answers 200 with `render()`, 404
// for another path, 400 for anything else, within two seconds (a client that stops reading is
// dropped), and closes the connection. Stopping (the destructor) ends any wait at once.
// Thread safety: Start and the destructor from one thread; `render` runs on the server's.
class MetricsHttpServer {
 public:
  // Listens on `address` ("host:port" or "[v6]:port"; port 0 = any free one).
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                          std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // "host:port" bound ("[::1]:port" for IPv6).
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void Run();
  void Serve(int fd);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // the destructor writes to stop the thread
  int port_ = 0;
  std::string address_;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace ferry::tools
