// Network addresses as users write them: "host:port", where host is an IPv4 address
// ("127.0.0.1"), an IPv6 address in brackets ("[::1]") or a name ("localhost", from /etc/hosts
// or DNS). Every place that parses or binds a TCP address goes through here, so each accepts the
// same forms and refuses the same mistakes.
//
// Names are resolved after numeric forms fail, with getaddrinfo on a helper thread, bounded by
// a timeout: a name that the resolver cannot answer (no DNS reachable) fails with
// kDeadlineExceeded instead of hanging the caller.
//
// Thread safety: free functions, safe from any thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry {

// Longest host accepted (a DNS name is at most 253 characters).
inline constexpr size_t kMaxHostChars = 255;
inline constexpr std::chrono::milliseconds kDefaultResolveTimeout{2000};

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};

// Splits "host:port" and "[v6]:port" (the port is required, 0..65535; an IPv6 host needs its
// brackets). kInvalidArgument names the address and what is wrong.
Result<HostPort> SplitHostPort(std::string_view address);
// "host:port", with brackets around a host that holds a ':' (IPv6).
std::string JoinHostPort(std::string_view host, uint16_t port);

// One resolved socket address (IPv4 or IPv6).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  uint16_t port() const;
  void set_port(uint16_t port);
  // Numeric host, without brackets ("::1", "127.0.0.1").
  std::string host() const;
  // "127.0.0.1:80", "[::1]:80".
  std::string ToString() const;
  // Whether the address is the wildcard (0.0.0.0 or ::).
  bool IsAny() const;
};

// The address of `host` (numeric IPv4, numeric IPv6 with or without brackets, or a name) and
// `port`. A name with both IPv4 and IPv6 addresses gives the IPv4 one (servers here listen on
// IPv4 by default, and "localhost" must reach them). An empty or malformed host is
// kInvalidArgument; a name the resolver does not know kUnavailable; one it does not answer in
// `timeout` kDeadlineExceeded.
Result<SocketAddress> ResolveHost(std::string_view host, uint16_t port,
                                  std::chrono::milliseconds timeout = kDefaultResolveTimeout);
// SplitHostPort then ResolveHost.
Result<SocketAddress> ParseHostPort(std::string_view address,
                                    std::chrono::milliseconds timeout = kDefaultResolveTimeout);

// The address a socket is bound to (getsockname), or the errno as a Status.
Result<SocketAddress> LocalAddress(int fd);

}  // namespace ferry
