#include "base/host_port.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "base/unique_fd.h"

namespace ferry {
namespace {

TEST(SplitHostPortTest, Ipv4NameAndBracketedIpv6) {
  Result<HostPort> v4 = SplitHostPort("127.0.0.1:80");
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 80);
  Result<HostPort> name = SplitHostPort("localhost:65535");
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->host, "localhost");
  EXPECT_EQ(name->port, 65535);
  Result<HostPort> v6 = SplitHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
}

TEST(SplitHostPortTest, RefusesBadInput) {
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "host:65536", "host:99999999999", "host:-1",
                          "host:8x", "[::1:80", "[::1]", "[::1]80", "::1:80", "[]:80", ""}) {
    Result<HostPort> r = SplitHostPort(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_NE(SplitHostPort("host:65536").status().message().find("above 65535"), std::string::npos);
  EXPECT_NE(SplitHostPort("[::1:80").status().message().find("unclosed"), std::string::npos);
  EXPECT_NE(SplitHostPort("127.0.0.1").status().message().find("missing \":port\""), std::string::npos);
  EXPECT_EQ(SplitHostPort(std::string(1000, 'a') + ":1").status().code(), Code::kInvalidArgument);
}

TEST(SplitHostPortTest, JoinAddsBracketsToIpv6) {
  EXPECT_EQ(JoinHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(JoinHostPort("localhost", 5), "localhost:5");
}

TEST(ResolveHostTest, NumericForms) {
  Result<SocketAddress> v4 = ParseHostPort("10.1.2.3:4000");
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->family(), AF_INET);
  EXPECT_EQ(v4->port(), 4000);
  EXPECT_EQ(v4->ToString(), "10.1.2.3:4000");
  EXPECT_FALSE(v4->IsAny());
  Result<SocketAddress> v6 = ParseHostPort("[fe80::1]:9");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->family(), AF_INET6);
  EXPECT_EQ(v6->ToString(), "[fe80::1]:9");
  EXPECT_TRUE(ResolveHost("0.0.0.0", 1)->IsAny());
  EXPECT_TRUE(ResolveHost("::", 1)->IsAny());
  EXPECT_TRUE(ResolveHost("[::]", 1)->IsAny());
}

TEST(ResolveHostTest, LocalhostFromHostsFile) {
  Result<SocketAddress> a = ParseHostPort("localhost:1234");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->port(), 1234);
  // IPv4 preferred where the name has both.
  if (a->family() == AF_INET) EXPECT_EQ(a->host(), "127.0.0.1");
  else EXPECT_EQ(a->host(), "::1");
}

TEST(ResolveHostTest, RefusesMalformedHostsWithoutALookup) {
  EXPECT_EQ(ResolveHost("", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("bad host", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("a/b", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("1.2.3", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("1.2.3.4.5", 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost(std::string(300, 'a'), 1).status().code(), Code::kInvalidArgument);
}

// Found by host_port_fuzz: the text before a NUL used to resolve ("127.0.0.1\0x" as 127.0.0.1).
TEST(ResolveHostTest, RefusesAHostWithANulInside) {
  using namespace std::string_literals;
  EXPECT_EQ(ResolveHost("127.0.0.1\0x"s, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("::1\0"s, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("[::1]\0"s, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveHost("localhost\0.evil"s, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseHostPort("127.0.0.1\0x:80"s).status().code(), Code::kInvalidArgument);
}

TEST(ResolveHostTest, UnknownNameFailsWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  Result<SocketAddress> r = ResolveHost("no-such-host.invalid", 1, std::chrono::milliseconds(1500));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == Code::kUnavailable || r.status().code() == Code::kDeadlineExceeded)
      << r.status().ToString();
  EXPECT_LT(took, std::chrono::milliseconds(1500) + std::chrono::milliseconds(500));
}

TEST(ResolveHostTest, LocalAddressOfABoundSocket) {
  os::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(fd.valid());
  Result<SocketAddress> a = ParseHostPort("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(::bind(fd.get(), a->get(), a->len), 0);
  Result<SocketAddress> bound = LocalAddress(fd.get());
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(bound->host(), "127.0.0.1");
  EXPECT_NE(bound->port(), 0);
}

}  // namespace
}  // namespace ferry
