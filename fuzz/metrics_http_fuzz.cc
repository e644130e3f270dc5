// libFuzzer target: the metrics endpoint's HTTP request parser (src/engine/metrics_server.cc),
// over a real connection: one MetricsServer for the whole run, and each input is one request
// (up to its first blank line, "\r\n\r\n" or "\n\n", or all of it when it has none; the client
// then closes its side). Every request must get exactly one well-formed answer: 200 with the
// rendered metrics only for "GET /metrics HTTP/...", 404 for another path, else 400; the
// server must stay up for the next one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/metrics_server.h"
#include "loopback.h"

namespace {

using ferry::internal::MetricsServer;

constexpr std::string_view kBody = "ferry_fuzz_metric 1\n";

MetricsServer* Server() {
  static MetricsServer* server = [] {
    signal(SIGPIPE, SIG_IGN);
    auto s = MetricsServer::Start(0, [] { return std::string(kBody); });
    if (!s.ok()) __builtin_trap();
    return s->release();  // lives for the whole run
  }();
  return server;
}

// The answer to `request`, read until the server closes; "" when the connection failed.
std::string Exchange(int port, std::string_view request) {
  const int fd = fuzz::DialLoopback(static_cast<uint16_t>(port));
  fuzz::SendAll(fd, request);
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 5000);
    if (r < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    if (r <= 0) __builtin_trap();           // the server must answer within its timeout
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

// The status the request must get: the first line (up to '\n') is "GET <path> HTTP/...".
std::string_view Expected(std::string_view request) {
  std::string_view head = request.substr(0, request.find('\n'));
  const size_t sp1 = head.find(' ');
  if (sp1 == std::string_view::npos || head.substr(0, sp1) != "GET") return "400";
  const size_t sp2 = head.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || head.substr(sp2 + 1, 5) != "HTTP/") return "400";
  return head.substr(sp1 + 1, sp2 - sp1 - 1) == "/metrics" ? "200" : "404";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MetricsServer* server = Server();
  // At most 4 KiB: under the server's kMaxRequestBytes, which answers longer heads with 400.
  std::string_view request(reinterpret_cast<const char*>(data), std::min<size_t>(size, 4096));
  // Bytes after the blank line are never read: sending them would make the server's close reset
  // the connection before its answer arrives.
  const size_t crlf = request.find("\r\n\r\n"), lf = request.find("\n\n");
  const size_t end = std::min(crlf == std::string_view::npos ? crlf : crlf + 4,
                              lf == std::string_view::npos ? lf : lf + 2);
  request = request.substr(0, end);
  const std::string answer = Exchange(server->port(), request);
  const std::string_view want = Expected(request);
  if (answer.rfind(std::string("HTTP/1.0 ") + std::string(want) + " ", 0) != 0) __builtin_trap();
  const size_t head_end = answer.find("\r\n\r\n");
  if (head_end == std::string::npos) __builtin_trap();
  const std::string_view body = std::string_view(answer).substr(head_end + 4);
  if (answer.find("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n") == std::string::npos)
    __builtin_trap();
  if ((want == "200") != (body == kBody)) __builtin_trap();
  return 0;
}
