// libFuzzer target: the address parser every TCP address of a user or a peer goes through
// (src/base/host_port.h): SplitHostPort, JoinHostPort and ResolveHost for numeric hosts (a name,
// which would ask the system resolver, is left out: the unit tests cover names). Every input
// must be refused with kInvalidArgument or give a host and port that join and split back to
// themselves, and a numeric host must resolve to an address whose text parses back to it.
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "base/host_port.h"

namespace {

// What ResolveHost would hand to getaddrinfo (host_port.cc's ValidName): letters, digits, '-',
// '.', '_', and not only digits and dots.
bool WouldLookUp(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host.find_first_not_of("0123456789.") == std::string_view::npos) return false;
  for (char c : host)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '.' || c == '_'))
      return false;
  return true;
}

bool SameAddress(const ferry::SocketAddress& a, const ferry::SocketAddress& b) {
  return a.len == b.len && std::memcmp(&a.storage, &b.storage, a.len) == 0;
}

void CheckResolve(std::string_view host, uint16_t port) {
  if (WouldLookUp(host)) return;
  auto a = ferry::ResolveHost(host, port);
  if (!a.ok()) {
    if (a.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
    return;
  }
  // A host with a NUL inside must not resolve as the text before it ("127.0.0.1\0x").
  if (host.find('\0') != std::string_view::npos) __builtin_trap();
  if (a->port() != port || (a->family() != AF_INET && a->family() != AF_INET6)) __builtin_trap();
  auto again = ferry::ParseHostPort(a->ToString());
  if (!again.ok() || !SameAddress(*again, *a) || again->IsAny() != a->IsAny()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto hp = ferry::SplitHostPort(input);
  if (!hp.ok()) {
    if (hp.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
  } else {
    if (hp->host.empty() || hp->host.size() > input.size()) __builtin_trap();
    // A host with brackets inside ("[[x]:1") is refused later, by ResolveHost; any other joins
    // and splits back to itself.
    if (hp->host.find_first_of("[]") == std::string::npos) {
      auto again = ferry::SplitHostPort(ferry::JoinHostPort(hp->host, hp->port));
      if (!again.ok() || again->host != hp->host || again->port != hp->port) __builtin_trap();
    }
    CheckResolve(hp->host, hp->port);
  }
  // The whole input as a host (the listen hosts of options), on an arbitrary port.
  CheckResolve(input, static_cast<uint16_t>(size * 257));
  return 0;
}
