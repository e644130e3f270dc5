#include "side_channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "socket_io.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;

Status Errno(const std::string& what) {
  return Status(Code::kUnavailable, what + ": " + std::strerror(errno));
}

// A frame's length prefix: kLengthBytes, little-endian whatever the host's byte order. (Tools
// see only ferry's public headers, so not base/endian.h.)
constexpr size_t kLengthBytes = 4;

void StoreLength(uint32_t n, char* out) {
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>(n >> (8 * i));
}

uint32_t LoadLength(const char* in) {
  uint32_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return n;
}

}  // namespace

Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Status(Code::kInvalidArgument, "address '" + address + "' is not host:port");
  std::string h = address.substr(0, colon);
  if (h.front() == '[') {
    // "[v6]:port": the host without its brackets.
    if (h.size() < 3 || h.back() != ']')
      return Status(Code::kInvalidArgument, "bad IPv6 host in '" + address + "' (want [v6]:port)");
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return Status(Code::kInvalidArgument, "an IPv6 host needs brackets: '" + address + "' (want [v6]:port)");
  }
  if (h.size() > 255) return Status(Code::kInvalidArgument, "host too long in '" + address + "'");
  char* end = nullptr;
  long p = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (end == address.c_str() + colon + 1 || *end != '\0' || p < 0 || p > 65535)
    return Status(Code::kInvalidArgument, "bad port in '" + address + "'");
  *host = h;
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

namespace {

struct SocketAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// "host:port" or "[v6]:port", host numeric (IPv4, IPv6) or a name (getaddrinfo; a name with
// both kinds of address gives its IPv4 one, as the engine's listeners do, so that "localhost"
// reaches a listener on 127.0.0.1).
Result<SocketAddr> Resolve(const std::string& address) {
  std::string host;
  uint16_t port = 0;
  FERRY_RETURN_IF_ERROR(ParseHostPort(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0)
    return Status(rc == EAI_NONAME ? Code::kInvalidArgument : Code::kUnavailable,
                  "cannot resolve '" + host + "': " + gai_strerror(rc));
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  SocketAddr out;
  if (pick == nullptr || pick->ai_addrlen > sizeof(out.storage)) {
    freeaddrinfo(found);
    return Status(Code::kInvalidArgument, "no address for '" + host + "'");
  }
  std::memcpy(&out.storage, pick->ai_addr, pick->ai_addrlen);
  out.len = static_cast<socklen_t>(pick->ai_addrlen);
  freeaddrinfo(found);
  return out;
}

// "127.0.0.1:80", "[::1]:80".
std::string ToString(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
}

}  // namespace

SideChannel::~SideChannel() { close(fd_); }

Result<std::unique_ptr<SideChannel>> SideChannel::Dial(const std::string& address,
                                                       std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(SocketAddr addr, Resolve(address));
  const auto until = Clock::now() + timeout;
  for (;;) {
    int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket");
    if (connect(fd, addr.get(), addr.len) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::unique_ptr<SideChannel>(new SideChannel(fd));
    }
    Status s = Errno("connecting to " + address);
    close(fd);
    if (Clock::now() >= until) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status SideChannel::Send(std::string_view frame, std::chrono::milliseconds timeout) {
  if (frame.size() > kMaxFrameBytes) return Status(Code::kInvalidArgument, "frame too large");
  const auto until = Clock::now() + timeout;
  std::string out(kLengthBytes, '\0');
  StoreLength(static_cast<uint32_t>(frame.size()), out.data());
  out.append(frame);
  return SendAllBy(fd_, out, until,
                   {.prefix = "side channel ",
                    .deadline = "the other side takes no more bytes (it stopped reading)"});
}

Status SideChannel::ReadExactly(char* out, size_t n, Clock::time_point until) {
  size_t got = 0;
  while (got < n) {
    pollfd pfd{fd_, POLLIN, 0};
    int r = poll(&pfd, 1, PollMillisUntil(until));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("side channel poll");
    if (r == 0) return Status(Code::kDeadlineExceeded, "the other side sent nothing in time");
    ssize_t k = ::recv(fd_, out + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return Errno("side channel receive");
    if (k == 0) return Status(Code::kUnavailable, "the other side closed the side channel");
    got += static_cast<size_t>(k);
  }
  return Status::Ok();
}

Result<std::string> SideChannel::Receive(std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  char len[kLengthBytes];
  FERRY_RETURN_IF_ERROR(ReadExactly(len, kLengthBytes, until));
  const uint32_t n = LoadLength(len);
  if (n > kMaxFrameBytes)
    return Status(Code::kInvalidArgument, "side channel frame of " + std::to_string(n) + " bytes");
  std::string frame(n, '\0');
  FERRY_RETURN_IF_ERROR(ReadExactly(frame.data(), n, until));
  return frame;
}

bool SideChannel::Readable(std::chrono::milliseconds timeout) {
  pollfd pfd{fd_, POLLIN, 0};
  return poll(&pfd, 1, PollMillisUntil(Clock::now() + timeout)) > 0;
}

SideListener::~SideListener() { close(fd_); }

Result<std::unique_ptr<SideListener>> SideListener::Listen(const std::string& address) {
  FERRY_ASSIGN_OR_RETURN(SocketAddr addr, Resolve(address));
  int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, addr.get(), addr.len) != 0 || listen(fd, 4) != 0) {
    Status s = Errno("listening on " + address);
    close(fd);
    return s;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return std::unique_ptr<SideListener>(new SideListener(fd, ToString(bound)));
}

Result<std::unique_ptr<SideChannel>> SideListener::Accept(std::chrono::milliseconds timeout) {
  // A signal (e.g. SIGUSR1 for the in-flight dump) interrupts the wait, not the server.
  const auto until = Clock::now() + timeout;
  int fd = -1;
  while (fd < 0) {
    pollfd pfd{fd_, POLLIN, 0};
    int r = poll(&pfd, 1, PollMillisUntil(until));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("accept poll");
    if (r == 0) return Status(Code::kDeadlineExceeded, "no peer connected in time");
    fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) return Errno("accept");
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::unique_ptr<SideChannel>(new SideChannel(fd));
}

std::string EngineListenHost(const std::string& address, const std::string& fallback) {
  std::string host;
  uint16_t port = 0;
  if (!ParseHostPort(address, &host, &port).ok()) return fallback;
  in_addr v4 = {};
  in6_addr v6 = {};
  const bool numeric = inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  return numeric ? host : fallback;
}

}  // namespace ferry::tools
