// The GET /metrics endpoint (EngineOptions::metrics_port) through a raw socket client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "engine/metrics_server.h"
#include "ferry/engine.h"

namespace ferry {
namespace {

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Sends `request` and reads the whole answer (the server closes the connection), waiting at
// most 5 s.
std::string Ask(int port, const std::string& request) {
  int fd = Connect(port);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::unique_ptr<Engine> MakeServing() {
  EngineOptions o;
  o.transports = {"local"};
  o.metrics_port = -1;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(MetricsHttp, ServesMetricsAndRefusesTheRest) {
  auto e = MakeServing();
  ASSERT_TRUE(e);
  ASSERT_GT(e->MetricsPort(), 0);
  ASSERT_TRUE(e->Notify(e->key(), "x").ok());
  const std::string ok = Ask(e->MetricsPort(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("ferry_notifications_total{engine=\"" + e->key() + "\",transport=\"\",peer=\"" + e->key() +
                    "\",result=\"OK\"} 1\n"),
            std::string::npos)
      << ok;
  const size_t body = ok.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_NE(ok.find("Content-Length: " + std::to_string(ok.size() - body - 4) + "\r\n"), std::string::npos);

  EXPECT_EQ(Ask(e->MetricsPort(), "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(Ask(e->MetricsPort(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 400", 0), 0u);
  EXPECT_EQ(Ask(e->MetricsPort(), "\x01\x02junk\r\n\r\n").rfind("HTTP/1.0 400", 0), 0u);
  EXPECT_EQ(Ask(e->MetricsPort(), std::string(20000, 'A')).rfind("HTTP/1.0 400", 0), 0u);
}

TEST(MetricsHttp, AStalledClientIsDroppedWithoutBlockingTheNext) {
  auto e = MakeServing();
  ASSERT_TRUE(e);
  const int stalled = Connect(e->MetricsPort());  // sends nothing
  const auto start = std::chrono::steady_clock::now();
  const std::string ok = Ask(e->MetricsPort(), "GET /metrics HTTP/1.0\r\n\r\n");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK", 0), 0u) << ok;
  // Served once the stalled one timed out, not after the next's own wait.
  EXPECT_LT(took, internal::MetricsServer::kRequestTimeout + std::chrono::seconds(2));
  // The stalled connection was closed by the server.
  char c;
  pollfd p{stalled, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 100), 1);
  EXPECT_EQ(recv(stalled, &c, 1, 0), 0);
  close(stalled);
}

// A client that asks and then never reads a long answer must not hold the server: the next
// client is served once its send times out, and stopping the server does not wait for it.
TEST(MetricsHttp, AClientThatStopsReadingIsDroppedWithoutHoldingTheNextOrTheStop) {
  const std::string big(8 << 20, 'm');  // far more than the sockets buffer unread
  auto server = internal::MetricsServer::Start(0, [&] { return big; });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
  const int stalled = Connect(port);
  ASSERT_EQ(send(stalled, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  const auto start = std::chrono::steady_clock::now();
  const std::string ok = Ask(port, get);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK", 0), 0u) << ok.substr(0, 64);
  EXPECT_EQ(ok.size() - ok.find("\r\n\r\n") - 4, big.size());
  EXPECT_LT(took, internal::MetricsServer::kResponseTimeout + std::chrono::seconds(3));
  close(stalled);
  // Stopping while the server waits on a client that does not read: at once.
  const int another = Connect(port);
  ASSERT_EQ(send(another, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server is writing to it
  const auto stop = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - stop, std::chrono::milliseconds(500));
  close(another);
}

// A signal that interrupts the server's wait for the rest of a request (the host process's
// SIGUSR1 dump, a profiler's timer) must not drop the request: it used to end it unanswered.
TEST(MetricsHttp, ASignalWhileReadingTheRequestDoesNotDropIt) {
  struct sigaction quiet {}, old {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR
  ASSERT_EQ(sigaction(SIGUSR2, &quiet, &old), 0);
  auto server = internal::MetricsServer::Start(0, [] { return std::string("m 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  const std::string first = "GET /metrics HTTP/1.0\r\n";
  ASSERT_EQ(send(fd, first.data(), first.size(), MSG_NOSIGNAL), static_cast<ssize_t>(first.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server waits for the rest
  // Every other thread of this process, the server's among them, gets the signal.
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (tid != static_cast<pid_t>(syscall(SYS_gettid))) syscall(SYS_tgkill, getpid(), tid, SIGUSR2);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(send(fd, "\r\n", 2, MSG_NOSIGNAL), 2);
  std::string answer;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  server->reset();
  sigaction(SIGUSR2, &old, nullptr);
  EXPECT_EQ(answer.rfind("HTTP/1.0 200 OK", 0), 0u) << answer;
}

TEST(MetricsHttp, PortIsCheckedAndOffByDefault) {
  EngineOptions o;
  o.transports = {"local"};
  auto off = Engine::Create(o);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->MetricsPort(), 0);
  for (int bad : {-2, 65536}) {
    o.metrics_port = bad;
    EXPECT_EQ(Engine::Create(o).status().code(), Code::kInvalidArgument) << bad;
  }
  // A port in use is refused at Create.
  auto e = MakeServing();
  ASSERT_TRUE(e);
  o.metrics_port = e->MetricsPort();
  EXPECT_EQ(Engine::Create(o).status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace ferry
