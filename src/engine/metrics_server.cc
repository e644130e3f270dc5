#include "engine/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>

#include "base/thread_pool.h"

namespace ferry::internal {
namespace {

// Sends `data` until `until`: a client that stops reading (its socket full) is dropped then,
// or at once when `wake_fd` says the server stops, so that it cannot hold the thread.
void WriteAll(int fd, std::string_view data, int wake_fd, std::chrono::steady_clock::time_point until) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd pfds[2] = {{fd, POLLOUT, 0}, {wake_fd, POLLIN, 0}};
    const int ready = poll(pfds, 2, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || pfds[1].revents) return;
  }
}

std::string Response(const char* status, std::string_view type, std::string_view body) {
  return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + std::string(type) +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         std::string(body);
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(int port, std::function<std::string()> render) {
  if (port < 0 || port > 65535)
    return Status(Code::kInvalidArgument, "metrics port must be in 0..65535, not " + std::to_string(port));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->render_ = std::move(render);
  s->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Status(Code::kUnavailable, std::string("metrics socket: ") + strerror(errno));
  int one = 1;
  setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(s->listen_fd_, 16) != 0)
    return Status(Code::kUnavailable,
                  "cannot serve metrics on 127.0.0.1:" + std::to_string(port) + ": " + strerror(errno));
  socklen_t len = sizeof(addr);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  if (pipe2(s->wake_, O_CLOEXEC) != 0)
    return Status(Code::kResourceExhausted, std::string("metrics pipe: ") + strerror(errno));
  Result<std::thread> t = StartThread("ferry-metrics", [p = s.get()] { p->Run(); });
  if (!t.ok()) return t.status().WithContext("the metrics endpoint");
  s->thread_ = std::move(t).value();
  return s;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    char c = 0;
    (void)!write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

void MetricsServer::Run() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void MetricsServer::Serve(int fd) {
  // Reads the request head within the timeout; a stalled or oversized request is dropped, so
  // that one client cannot hold the server.
  std::string req;
  const auto until = std::chrono::steady_clock::now() + kRequestTimeout;
  const auto answer = [&](const std::string& response) {
    WriteAll(fd, response, wake_[0], std::chrono::steady_clock::now() + kResponseTimeout);
  };
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() >= kMaxRequestBytes) return answer(Response("400 Bad Request", "text/plain", "too large\n"));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd pfds[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int ready = poll(pfds, 2, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;  // a signal to the process: the request stands
    if (ready <= 0 || pfds[1].revents) return;
    ssize_t n = recv(fd, buf, std::min(sizeof(buf), kMaxRequestBytes - req.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the client closed: answer what it sent
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string_view head(req.data(), std::min(req.find('\n'), req.size()));
  // "GET <path> HTTP/x.y"
  const size_t sp1 = head.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : head.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || head.substr(0, sp1) != "GET" ||
      head.substr(sp2 + 1, 5) != "HTTP/")
    return answer(Response("400 Bad Request", "text/plain", "bad request\n"));
  std::string_view path = head.substr(sp1 + 1, sp2 - sp1 - 1);
  if (path != "/metrics") return answer(Response("404 Not Found", "text/plain", "not found\n"));
  answer(Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()));
}

}  // namespace ferry::internal
