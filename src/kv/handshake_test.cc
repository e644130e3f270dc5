// The handshake endpoint: serving and fetching, deadlines on both sides, hostile clients and
// servers, the connection bound, and bad addresses.
#include "kv/handshake.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "base/endian.h"
#include "base/os.h"

namespace ferry::kv {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A plain blocking TCP socket for playing a hostile peer.
class RawSocket {
 public:
  explicit RawSocket(int fd = -1) : fd_(fd) {}
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(RawSocket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  int get() const { return fd_; }

  // Listens on 127.0.0.1 at a free port.
  static RawSocket Listen(uint16_t* port) {
    RawSocket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(s.fd_, 16), 0);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::getsockname(s.fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    *port = ntohs(a.sin_port);
    return s;
  }
  static RawSocket Connect(uint16_t port) {
    RawSocket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    EXPECT_EQ(::connect(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{5, 0};  // a broken server fails the test, never hangs it
    ::setsockopt(s.fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return s;
  }
  void Send(std::string_view bytes) {
    EXPECT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // True once the peer closed (EOF or reset); reads and discards anything before it.
  bool PeerClosed() {
    char buf[256];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) continue;
      return n == 0 || errno == ECONNRESET;
    }
  }

 private:
  int fd_;
};

std::string Address(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

template <typename F>
bool WaitUntil(F&& cond, milliseconds limit = milliseconds(5000)) {
  const auto end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

std::unique_ptr<HandshakeServer> Serve(std::string metadata, HandshakeOptions options = {}) {
  auto server = HandshakeServer::Start(std::move(metadata), options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(Handshake, ServesAndFetches) {
  auto server = Serve("metadata-v1");
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->address(), Address(server->port()));
  Result<std::string> got = FetchMetadata(server->address(), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "metadata-v1");
  server->SetMetadata(std::string("v2\0with a NUL", 13));
  got = FetchMetadata(server->address(), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, std::string("v2\0with a NUL", 13));
  // Empty metadata and "localhost" are fine too.
  server->SetMetadata("");
  got = FetchMetadata("localhost:" + std::to_string(server->port()), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "");
  EXPECT_TRUE(WaitUntil([&] { return server->served() == 3; }));
  EXPECT_EQ(server->rejected(), 0u);
}

TEST(Handshake, LargeMetadataAndEveryInterface) {
  HandshakeOptions options;
  options.host = "0.0.0.0";
  std::string big(kMaxHandshakeBytes, 'x');
  big[12345] = 'y';
  auto server = Serve(big, options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->address(), Address(server->port()));
  Result<std::string> got = FetchMetadata(server->address(), std::chrono::seconds(20));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == big);
  // Over the bound: refused at Start, and SetMetadata keeps what it had.
  EXPECT_EQ(HandshakeServer::Start(std::string(kMaxHandshakeBytes + 1, 'x')).status().code(),
            Code::kInvalidArgument);
  server->SetMetadata(std::string(kMaxHandshakeBytes + 1, 'z'));
  got = FetchMetadata(server->address(), std::chrono::seconds(20));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == big);
}

TEST(Handshake, BadOptionsAndAddresses) {
  HandshakeOptions bad;
  bad.host = "not an ip";
  EXPECT_EQ(HandshakeServer::Start("m", bad).status().code(), Code::kInvalidArgument);
  bad = {};
  bad.max_connections = 0;
  EXPECT_EQ(HandshakeServer::Start("m", bad).status().code(), Code::kInvalidArgument);
  bad = {};
  bad.io_timeout = milliseconds(0);
  EXPECT_EQ(HandshakeServer::Start("m", bad).status().code(), Code::kInvalidArgument);
  for (const char* a : {"", "host", "1.2.3.4:99999", "1.2.3.4:0", "1.2.3.4:", ":80", "1.2.3.4:80x",
                        "1.2.3:80", "1.2.3.4:-1", "[::1:80", "::1:80", "bad name:80"}) {
    EXPECT_EQ(FetchMetadata(a, milliseconds(100)).status().code(), Code::kInvalidArgument) << a;
  }
  // A name is looked up, within the call's timeout; one that does not resolve fails quickly.
  const Code unknown = FetchMetadata("no-such-host.invalid:80", milliseconds(500)).status().code();
  EXPECT_TRUE(unknown == Code::kUnavailable || unknown == Code::kDeadlineExceeded) << static_cast<int>(unknown);
}

// One real listener over IPv6 loopback, given as "::1" and fetched as "[::1]:port".
TEST(Handshake, ServesOverIpv6Loopback) {
  {
    RawSocket probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    if (probe.get() < 0 || ::bind(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      GTEST_SKIP() << "no IPv6 loopback here: " << std::strerror(errno);
  }
  for (const char* host : {"::1", "[::1]"}) {
    HandshakeOptions options;
    options.host = host;
    auto server = Serve("over-v6", options);
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->address(), "[::1]:" + std::to_string(server->port()));
    Result<std::string> got = FetchMetadata(server->address(), std::chrono::seconds(5));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, "over-v6");
  }
}

TEST(Handshake, NothingListeningIsUnavailableQuickly) {
  uint16_t port = 0;
  { RawSocket::Listen(&port); }  // a port that was free a moment ago, and is closed now
  const auto start = Clock::now();
  Result<std::string> got = FetchMetadata(Address(port), std::chrono::seconds(5));
  EXPECT_EQ(got.status().code(), Code::kUnavailable) << got.status().ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
}

TEST(Handshake, SilentPeerTimesOut) {
  uint16_t port = 0;
  RawSocket listener = RawSocket::Listen(&port);  // accepts (in its backlog), never answers
  const auto start = Clock::now();
  Result<std::string> got = FetchMetadata(Address(port), milliseconds(300));
  const auto took = Clock::now() - start;
  EXPECT_EQ(got.status().code(), Code::kDeadlineExceeded) << got.status().ToString();
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(800));
}

// A server that answers every request with `answer` and closes.
std::thread FakeServer(RawSocket& listener, std::string answer) {
  return std::thread([&listener, answer] {
    RawSocket c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    char req[8];
    if (::recv(c.get(), req, sizeof(req), MSG_WAITALL) != 8) return;
    (void)::send(c.get(), answer.data(), answer.size(), MSG_NOSIGNAL);
  });
}

TEST(Handshake, ClientRefusesHostileAnswers) {
  uint16_t port = 0;
  RawSocket listener = RawSocket::Listen(&port);
  char header[4];
  StoreLe32(header, static_cast<uint32_t>(kMaxHandshakeBytes + 1));
  std::thread t = FakeServer(listener, std::string(header, 4) + "abc");
  EXPECT_EQ(FetchMetadata(Address(port), std::chrono::seconds(5)).status().code(),
            Code::kInvalidArgument);
  t.join();
  // A length that promises more than comes before the close.
  StoreLe32(header, 10);
  t = FakeServer(listener, std::string(header, 4) + "abc");
  EXPECT_EQ(FetchMetadata(Address(port), std::chrono::seconds(5)).status().code(),
            Code::kUnavailable);
  t.join();
  // A header cut short.
  t = FakeServer(listener, std::string(header, 2));
  EXPECT_EQ(FetchMetadata(Address(port), std::chrono::seconds(5)).status().code(),
            Code::kUnavailable);
  t.join();
}

TEST(Handshake, HostileClientsAreDroppedAndCounted) {
  HandshakeOptions options;
  options.io_timeout = milliseconds(200);
  auto server = Serve("meta", options);
  ASSERT_NE(server, nullptr);
  RawSocket garbage = RawSocket::Connect(server->port());
  garbage.Send("GET / HTTP/1.1\r\n");
  RawSocket silent = RawSocket::Connect(server->port());
  RawSocket partial = RawSocket::Connect(server->port());
  partial.Send("ferry");
  // Others are served meanwhile.
  Result<std::string> got = FetchMetadata(server->address(), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "meta");
  EXPECT_TRUE(garbage.PeerClosed());
  const auto start = Clock::now();
  EXPECT_TRUE(silent.PeerClosed());
  EXPECT_TRUE(partial.PeerClosed());
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
  EXPECT_TRUE(WaitUntil([&] { return server->rejected() == 3; })) << server->rejected();
  // A client that closes before asking.
  { RawSocket gone = RawSocket::Connect(server->port()); }
  EXPECT_TRUE(WaitUntil([&] { return server->rejected() == 4; })) << server->rejected();
  got = FetchMetadata(server->address(), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  // Counted once the server has sent the last byte, which may be after the client has it.
  EXPECT_TRUE(WaitUntil([&] { return server->served() == 2; })) << server->served();
  EXPECT_EQ(server->rejected(), 4u);
}

TEST(Handshake, ConnectionsOverTheBoundAreClosedAtOnce) {
  HandshakeOptions options;
  options.max_connections = 2;
  options.io_timeout = std::chrono::seconds(10);
  auto server = Serve("meta", options);
  ASSERT_NE(server, nullptr);
  RawSocket a = RawSocket::Connect(server->port());
  RawSocket b = RawSocket::Connect(server->port());
  a.Send("ferry");  // open, not done
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  RawSocket c = RawSocket::Connect(server->port());
  EXPECT_TRUE(c.PeerClosed());
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_TRUE(WaitUntil([&] { return server->rejected() == 1; }));
  // The open ones are still served.
  a.Send("kv1");
  char header[4];
  ASSERT_EQ(::recv(a.get(), header, 4, MSG_WAITALL), 4);
  EXPECT_EQ(LoadLe32(header), 4u);
}

TEST(Handshake, ManyConcurrentFetches) {
  auto server = Serve(std::string(100000, 'm'));
  ASSERT_NE(server, nullptr);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 4; ++j) {
        Result<std::string> got = FetchMetadata(server->address(), std::chrono::seconds(10));
        if (got.ok() && got->size() == 100000) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 128);
  EXPECT_TRUE(WaitUntil([&] { return server->served() == 128; }));
  EXPECT_EQ(server->rejected(), 0u);
}

// Sockets come from the OS seam: a failure there is a clean error on either side.
class NoSockets : public os::EnvWrapper {
 public:
  NoSockets() : os::EnvWrapper(os::Env::Default()) {}
  int Socket(int, int, int) override {
    errno = EMFILE;
    return -1;
  }
};

TEST(Handshake, SocketFailureThroughTheSeam) {
  // No server runs while the Env is swapped (it must outlive every call made through it).
  NoSockets env;
  os::ScopedEnv scoped(&env);
  EXPECT_EQ(FetchMetadata("127.0.0.1:9", std::chrono::seconds(1)).status().code(),
            Code::kResourceExhausted);
  EXPECT_EQ(HandshakeServer::Start("meta").status().code(), Code::kResourceExhausted);
}

TEST(Handshake, DestructionClosesOpenConnections) {
  auto server = Serve("meta");
  ASSERT_NE(server, nullptr);
  std::vector<RawSocket> open;
  for (int i = 0; i < 4; ++i) open.push_back(RawSocket::Connect(server->port()));
  open[1].Send("ferr");
  std::this_thread::sleep_for(milliseconds(50));
  const uint16_t port = server->port();
  server.reset();
  for (auto& s : open) EXPECT_TRUE(s.PeerClosed());
  // Nothing listens there any more.
  EXPECT_EQ(FetchMetadata(Address(port), std::chrono::seconds(2)).status().code(),
            Code::kUnavailable);
}

}  // namespace
}  // namespace ferry::kv
