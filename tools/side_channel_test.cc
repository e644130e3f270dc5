#include "side_channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace ferry::tools {
namespace {

using namespace std::chrono_literals;

// A plain TCP socket connected to `address` ("ip:port"): the other side of the wire, byte for
// byte, without SideChannel's framing.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address) {
    std::string host;
    uint16_t port = 0;
    EXPECT_TRUE(ParseHostPort(address, &host, &port).ok());
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET, host.c_str(), &addr.sin_addr), 1);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawPeer() { Close(); }
  void Write(const std::string& bytes) {
    EXPECT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  std::string Read(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t k = ::recv(fd_, out.data() + got, n - got, 0);
      if (k <= 0) break;
      got += static_cast<size_t>(k);
    }
    out.resize(got);
    return out;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct Pair {
  std::unique_ptr<SideListener> listener;
  std::unique_ptr<RawPeer> raw;
  std::unique_ptr<SideChannel> channel;
};

Pair Connect() {
  Pair p;
  auto listener = SideListener::Listen("127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  p.listener = std::move(*listener);
  p.raw = std::make_unique<RawPeer>(p.listener->address());
  auto channel = p.listener->Accept(5s);
  EXPECT_TRUE(channel.ok()) << channel.status().ToString();
  p.channel = std::move(*channel);
  return p;
}

TEST(SideChannel, SendPrefixesTheLengthLittleEndian) {
  Pair p = Connect();
  const std::string frame(0x010203, 'x');
  ASSERT_TRUE(p.channel->Send(frame).ok());
  EXPECT_EQ(p.raw->Read(4), std::string("\x03\x02\x01\x00", 4));
  EXPECT_EQ(p.raw->Read(frame.size()), frame);
}

TEST(SideChannel, ReceiveReadsALittleEndianLength) {
  Pair p = Connect();
  p.raw->Write(std::string("\x05\x00\x00\x00hello", 9));
  p.raw->Write(std::string("\x00\x00\x00\x00", 4));  // an empty frame
  auto first = p.channel->Receive(5s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, "hello");
  auto second = p.channel->Receive(5s);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, "");
}

TEST(SideChannel, RefusesAFrameOverTheLimit) {
  Pair p = Connect();
  // kMaxFrameBytes + 1 = 0x00100001.
  p.raw->Write(std::string("\x01\x00\x10\x00", 4));
  EXPECT_EQ(p.channel->Receive(5s).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p.channel->Send(std::string(kMaxFrameBytes + 1, 'x')).code(), Code::kInvalidArgument);
}

TEST(SideChannel, TruncatedFrameIsUnavailable) {
  Pair p = Connect();
  p.raw->Write(std::string("\x08\x00\x00\x00" "abc", 7));
  p.raw->Close();
  EXPECT_EQ(p.channel->Receive(5s).status().code(), Code::kUnavailable);
}

TEST(SideChannel, SilentPeerIsDeadlineExceeded) {
  Pair p = Connect();
  p.raw->Write(std::string("\x08\x00", 2));  // half a length
  EXPECT_EQ(p.channel->Receive(50ms).status().code(), Code::kDeadlineExceeded);
}

TEST(SideChannel, APeerThatStopsReadingIsDeadlineExceededNotAHang) {
  Pair p = Connect();  // the raw peer never reads
  const std::string frame(kMaxFrameBytes, 'x');
  Status last;
  for (int i = 0; i < 256 && last.ok(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    last = p.channel->Send(frame, 100ms);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  }
  EXPECT_EQ(last.code(), Code::kDeadlineExceeded) << last.ToString();
}

// Whether this host can listen on the IPv6 loopback (containers often have IPv6 off).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a = {};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

TEST(SideChannelAddress, ParsesBracketedIpv6AndRefusesBareOnes) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(ParseHostPort("[::1]:8080", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 8080);
  ASSERT_TRUE(ParseHostPort("localhost:0", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  for (const char* bad : {"::1:80", "[::1:80", "[]:80", "host", ":80", "host:x", "host:65536"})
    EXPECT_EQ(ParseHostPort(bad, &host, &port).code(), Code::kInvalidArgument) << bad;
  EXPECT_EQ(EngineListenHost("[::1]:5", "fallback"), "::1");
  EXPECT_EQ(EngineListenHost("10.1.2.3:5", "fallback"), "10.1.2.3");
  EXPECT_EQ(EngineListenHost("localhost:5", "fallback"), "fallback");
  EXPECT_EQ(EngineListenHost("::1:5", "fallback"), "fallback");
}

TEST(SideChannelAddress, AHostNameListensAndDialsOverIpv4) {
  auto listener = SideListener::Listen("localhost:0");
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  const std::string bound = (*listener)->address();
  EXPECT_EQ(bound.rfind("127.0.0.1:", 0), 0u) << bound;
  auto dialed = SideChannel::Dial("localhost:" + bound.substr(bound.rfind(':') + 1), 5s);
  ASSERT_TRUE(dialed.ok()) << dialed.status().ToString();
  auto accepted = (*listener)->Accept(5s);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  ASSERT_TRUE((*dialed)->Send("over a name").ok());
  auto got = (*accepted)->Receive(5s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "over a name");
  // An unknown name: kInvalidArgument, or kUnavailable where no resolver answers at all.
  const Code unknown = SideListener::Listen("no-such-host.invalid:0").status().code();
  EXPECT_TRUE(unknown == Code::kInvalidArgument || unknown == Code::kUnavailable) << static_cast<int>(unknown);
}

TEST(SideChannelAddress, ListensAndDialsOnTheIpv6Loopback) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this host has no IPv6 loopback (::1 cannot be bound)";
  auto listener = SideListener::Listen("[::1]:0");
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  const std::string bound = (*listener)->address();
  ASSERT_EQ(bound.rfind("[::1]:", 0), 0u) << bound;
  auto dialed = SideChannel::Dial(bound, 5s);
  ASSERT_TRUE(dialed.ok()) << dialed.status().ToString();
  auto accepted = (*listener)->Accept(5s);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  ASSERT_TRUE((*accepted)->Send("v6").ok());
  auto got = (*dialed)->Receive(5s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "v6");
}

}  // namespace
}  // namespace ferry::tools
