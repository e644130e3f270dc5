// A ucx transport that shuts down while peers keep connecting to it: a client (raw UCX through
// its sockaddr connection manager, in a child process) opens connections to the transport's
// listener in a loop while the transport is destroyed at a random moment. The listener is
// ferry's own (door.h): UCX's connection-manager bytes are not a ferry handshake and are
// refused, before and during the shutdown; a shut-down transport takes no connection, and the
// process never crashes. Repeated for many lifetimes of the transport.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <ucp/api/ucp.h>

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include <poll.h>
#include <fcntl.h>

#include "testing/loopback.h"
#include "transport/inbox.h"
#include "transport/transport.h"
#include "transport/ucx/listen_socket.h"
#include "transport/ucx/worker.h"  // CloseEndpoint

namespace ferry::internal {
// Defined in transport.cc (the registry's entry for `ucx`).
Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportContext& ctx);
}  // namespace ferry::internal

namespace ferry::internal::ucx {
namespace {

using namespace std::chrono_literals;

using Listening = ::ferry::testing::LoopbackListener;

// Whether a TCP connection to `port` on loopback completes within `wait`.
bool Connects(uint16_t port, std::chrono::milliseconds wait) {
  auto [fd, rc] = ::ferry::testing::DialLoopback(port, SOCK_NONBLOCK);
  bool ok = rc == 0;
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(wait.count())) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      ok = err == 0;
    }
  }
  close(fd);
  return ok;
}

TEST(UcxListenSocket, FoundByItsPort) {
  Listening l;
  EXPECT_EQ(FindListeningSocket(l.port), l.fd);
  // Sockets that are not listening are passed over: an unbound one, and after close none.
  int other = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(FindListeningSocket(0), -1);
  close(other);
  const uint16_t port = l.port;
  close(l.fd);
  l.fd = -1;
  EXPECT_EQ(FindListeningSocket(port), -1);
}

TEST(UcxListenSocket, CountsTheConnectionsItAccepted) {
  Listening l;
  EXPECT_EQ(CountAcceptedConnections(l.port), 0);
  int client = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(l.port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  int accepted = accept(l.fd, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  // The accepted end has the listener's port; the client's end (an ephemeral port) does not count.
  EXPECT_EQ(CountAcceptedConnections(l.port), 1);
  close(accepted);
  EXPECT_EQ(CountAcceptedConnections(l.port), 0);
  close(client);
}


// The ucx transport's factory, as the registry lists it (ferry_transport's registry.cc), taken
// from this transport's library alone: the test links no other transport and no engine.
TransportFactory UcxFactory() { return &::ferry::internal::MakeUcxTransport; }

// Connects to `port` on loopback over and over until told to stop; each endpoint is given a
// few progress rounds and then closed with force.
class Connector {
 public:
  explicit Connector(uint16_t port) : port_(port) {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, nullptr, &context_), UCS_OK);
    ucp_worker_params_t wp = {};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Connector() {
    stop_.store(true);
    thread_.join();
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  int attempts() const { return attempts_.load(); }

 private:
  static void OnError(void*, ucp_ep_h, ucs_status_t) {}

  void Loop() {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    std::vector<ucp_ep_h> open;
    while (!stop_.load()) {
      ucp_ep_params_t params = {};
      params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
      params.sockaddr.addrlen = sizeof(addr);
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &Connector::OnError;
      ucp_ep_h ep = nullptr;
      if (ucp_ep_create(worker_, &params, &ep) == UCS_OK) open.push_back(ep);
      attempts_.fetch_add(1);
      for (int i = 0; i < 20; ++i) ucp_worker_progress(worker_);
      // Keep a few connections half-open so that requests are in every stage at shutdown.
      if (open.size() > 4) {
        CloseEndpoint(open.front());
        open.erase(open.begin());
      }
    }
    for (ucp_ep_h ep : open) CloseEndpoint(ep);
  }

  uint16_t port_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<int> attempts_{0};
  std::thread thread_;
};

// The child process of the test below: connects to the port in FERRY_TEST_CONNECT_PORT until
// it is killed.
TEST(UcxShutdown, DISABLED_Connector) {
  const char* port = std::getenv("FERRY_TEST_CONNECT_PORT");
  if (port == nullptr) GTEST_SKIP() << "run by PeersConnectingWhileTheTransportShutsDown";
  // Dies with the test that started it, even if that one crashes.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (const char* parent = std::getenv("FERRY_TEST_PARENT"); parent == nullptr || getppid() != std::atoi(parent))
    return;
  Connector connector(static_cast<uint16_t>(std::atoi(port)));
  for (;;) std::this_thread::sleep_for(1s);
}

pid_t SpawnConnector(uint16_t port) {
  std::string self = "/proc/self/exe";  // this binary, even if rebuilt meanwhile
  std::string filter = "--gtest_filter=UcxShutdown.DISABLED_Connector";
  std::string also = "--gtest_also_run_disabled_tests";
  std::string env = "FERRY_TEST_CONNECT_PORT=" + std::to_string(port);
  std::string parent = "FERRY_TEST_PARENT=" + std::to_string(getpid());
  char* argv[] = {self.data(), filter.data(), also.data(), nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(env.data());
  envp.push_back(parent.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  return pid;
}

TEST(UcxShutdown, PeersConnectingWhileTheTransportShutsDown) {
  TransportFactory make = UcxFactory();
  ASSERT_NE(make, nullptr);
  EngineOptions options;
  options.ucx.listen_host = "127.0.0.1";
  std::mt19937 rng(7);
  int peer_crashes = 0;
  for (int round = 0; round < 30; ++round) {
    TransportContext ctx{"shutdown" + std::to_string(round), &options,
                         std::make_shared<Inbox>(16, 1024)};
    auto t = make(ctx);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::unique_ptr<Transport> transport = std::move(t).value();
    ASSERT_FALSE(transport->Addresses().empty());
    const std::string a = transport->Addresses()[0];
    auto port = static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
    pid_t child = SpawnConnector(port);
    ASSERT_GT(child, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(20000 + rng() % 30000));
    if (round % 2 == 0) {
      transport->Shutdown();  // as the engine does, then destroyed
      if (round % 10 == 0) {
        EXPECT_FALSE(Connects(port, 100ms)) << "a shut-down engine took a connection";
      }
    }
    transport.reset();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    kill(child, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    if (!(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)) ++peer_crashes;
  }
  std::printf("peer crashes: %d\n", peer_crashes);
}

}  // namespace
}  // namespace ferry::internal::ucx
