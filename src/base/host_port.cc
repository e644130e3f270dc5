#include "base/host_port.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "base/os.h"
#include "base/thread_pool.h"

namespace ferry {
namespace {

Status Bad(std::string_view address, std::string_view why) {
  std::string m = "address \"";
  m += address.substr(0, kMaxHostChars + 8);
  m += "\": ";
  m += why;
  return Status(Code::kInvalidArgument, std::move(m));
}

bool NumericV4(const std::string& host, uint16_t port, SocketAddress* out) {
  sockaddr_in a{};
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return false;
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  std::memcpy(&out->storage, &a, sizeof(a));
  out->len = sizeof(a);
  return true;
}

bool NumericV6(const std::string& host, uint16_t port, SocketAddress* out) {
  sockaddr_in6 a{};
  if (::inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) != 1) return false;
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  std::memcpy(&out->storage, &a, sizeof(a));
  out->len = sizeof(a);
  return true;
}

// getaddrinfo's answer, shared with the thread that asks: a caller that stops waiting leaves
// the thread to finish and free it.
struct Lookup {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = 0;
  SocketAddress v4, v6;
  bool has_v4 = false, has_v6 = false;
};

void RunLookup(const std::shared_ptr<Lookup>& l, const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  std::lock_guard lock(l->mu);
  l->rc = rc;
  for (addrinfo* i = rc == 0 ? res : nullptr; i != nullptr; i = i->ai_next) {
    if (i->ai_family == AF_INET && !l->has_v4 && i->ai_addrlen <= sizeof(sockaddr_storage)) {
      std::memcpy(&l->v4.storage, i->ai_addr, i->ai_addrlen);
      l->v4.len = i->ai_addrlen;
      l->has_v4 = true;
    } else if (i->ai_family == AF_INET6 && !l->has_v6 && i->ai_addrlen <= sizeof(sockaddr_storage)) {
      std::memcpy(&l->v6.storage, i->ai_addr, i->ai_addrlen);
      l->v6.len = i->ai_addrlen;
      l->has_v6 = true;
    }
  }
  if (res != nullptr) ::freeaddrinfo(res);
  l->done = true;
  l->cv.notify_all();
}

// Letters, digits, '-', '.', '_'; and not only digits and dots, which getaddrinfo would read
// as a short IPv4 form ("1.2.3" = 1.2.0.3) that inet_pton refused on purpose.
bool ValidName(std::string_view host) {
  if (host.find_first_not_of("0123456789.") == std::string_view::npos) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<HostPort> SplitHostPort(std::string_view address) {
  if (address.size() > kMaxHostChars + 8) return Bad(address, "too long");
  HostPort out;
  std::string_view rest;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos) return Bad(address, "unclosed '['");
    out.host = std::string(address.substr(1, close - 1));
    rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return Bad(address, "missing \":port\" after ']'");
    rest.remove_prefix(1);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return Bad(address, "missing \":port\"");
    out.host = std::string(address.substr(0, colon));
    if (out.host.find(':') != std::string::npos)
      return Bad(address, "an IPv6 host needs brackets (\"[::1]:port\")");
    rest = address.substr(colon + 1);
  }
  if (out.host.empty()) return Bad(address, "missing host");
  unsigned port = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
  if (rest.empty() || ec != std::errc() || end != rest.data() + rest.size())
    return Bad(address, "the port is not a number");
  if (port > 65535) return Bad(address, "port above 65535");
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string JoinHostPort(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out += '[';
    out += host;
    out += ']';
  } else {
    out += host;
  }
  out += ':';
  out += std::to_string(port);
  return out;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::set_port(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

std::string SocketAddress::host() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
  else if (family() == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
  return buf;
}

std::string SocketAddress::ToString() const { return JoinHostPort(host(), port()); }

bool SocketAddress::IsAny() const {
  if (family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

Result<SocketAddress> ResolveHost(std::string_view host_in, uint16_t port, std::chrono::milliseconds timeout) {
  std::string_view h = host_in;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) return Bad(host_in, "missing host");
  if (h.size() > kMaxHostChars) return Bad(host_in, "host too long");
  // inet_pton and getaddrinfo read a C string: "127.0.0.1\0x" would pass as 127.0.0.1.
  if (h.find('\0') != std::string_view::npos) return Bad(host_in, "a NUL byte inside the host");
  const std::string host(h);
  SocketAddress out;
  if (NumericV4(host, port, &out) || NumericV6(host, port, &out)) return out;
  if (!ValidName(host)) return Bad(host_in, "not an IP address or a host name");
  // A lookup that outlives its caller's timeout keeps its thread until getaddrinfo returns:
  // bound how many may be out at once, so a dead resolver cannot make threads pile up.
  static std::atomic<int> outstanding{0};
  constexpr int kMaxOutstandingLookups = 16;
  if (outstanding.fetch_add(1) >= kMaxOutstandingLookups) {
    outstanding.fetch_sub(1);
    return Status(Code::kResourceExhausted, "resolving " + host + ": " + std::to_string(kMaxOutstandingLookups) +
                                                " lookups are already waiting on the resolver");
  }
  auto lookup = std::make_shared<Lookup>();
  Result<std::thread> t = StartThread("ferry-resolve", [lookup, host] {
    RunLookup(lookup, host);
    outstanding.fetch_sub(1);
  });
  if (!t.ok()) {
    outstanding.fetch_sub(1);
    return Status(Code::kResourceExhausted, "resolving " + host + ": " + std::string(t.status().message()));
  }
  t->detach();
  std::unique_lock lock(lookup->mu);
  if (!lookup->cv.wait_for(lock, timeout, [&] { return lookup->done; }))
    return Status(Code::kDeadlineExceeded,
                  "resolving " + host + ": no answer within " + std::to_string(timeout.count()) + " ms");
  if (lookup->rc != 0)
    return Status(Code::kUnavailable, "resolving " + host + ": " + ::gai_strerror(lookup->rc));
  if (lookup->has_v4) out = lookup->v4;
  else if (lookup->has_v6) out = lookup->v6;
  else return Status(Code::kUnavailable, "resolving " + host + ": no IPv4 or IPv6 address");
  out.set_port(port);
  return out;
}

Result<SocketAddress> ParseHostPort(std::string_view address, std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(HostPort hp, SplitHostPort(address));
  return ResolveHost(hp.host, hp.port, timeout);
}

Result<SocketAddress> LocalAddress(int fd) {
  SocketAddress out;
  out.len = sizeof(out.storage);
  if (::getsockname(fd, out.get(), &out.len) != 0) return os::ErrnoStatus("getsockname", errno);
  return out;
}

}  // namespace ferry
