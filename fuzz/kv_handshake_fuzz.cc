// libFuzzer target: both ends of the KV connector's metadata handshake (src/kv/handshake.h),
// over real connections. The first byte picks the end (its low bit):
//   0: the rest (at most 8 bytes, all the server reads) is a request to one HandshakeServer that
//      lives for the whole run: "ferrykv1" must be answered with the 4-byte length and the
//      metadata, anything else closed without an answer, and the server must keep serving;
//   1: the rest is what a peer answers FetchMetadata with (a thread of this target plays the
//      peer): a length within kMaxHandshakeBytes and that many bytes must give those bytes; a
//      longer length kInvalidArgument; an answer cut short kUnavailable.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "kv/handshake.h"
#include "loopback.h"

namespace {

using ferry::kv::kMaxHandshakeBytes;

constexpr std::string_view kMetadata = "worker metadata as packed bytes";

int Listen(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    __builtin_trap();
  *port = ntohs(addr.sin_port);
  return fd;
}

// Everything the other side sends until it closes (or 5 s pass: a hang is a finding).
std::string ReadToEnd(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 5000);
    if (r < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    if (r <= 0) __builtin_trap();
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

void CheckServer(std::string_view request) {
  static ferry::kv::HandshakeServer* server = [] {
    auto s = ferry::kv::HandshakeServer::Start(std::string(kMetadata));
    if (!s.ok()) __builtin_trap();
    return s->release();  // lives for the whole run
  }();
  request = request.substr(0, 8);
  const int fd = fuzz::DialLoopback(server->port());
  fuzz::SendAll(fd, request);
  shutdown(fd, SHUT_WR);
  const std::string answer = ReadToEnd(fd);
  close(fd);
  std::string want;
  if (request == "ferrykv1") {
    const uint32_t n = kMetadata.size();
    want = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16), static_cast<char>(n >> 24)};
    want += kMetadata;
  }
  if (answer != want) __builtin_trap();
}

// The peer FetchMetadata asks: takes the 8-byte request, answers with `g_answer`, closes.
std::mutex g_mu;
std::string g_answer;

uint16_t Peer() {
  static const uint16_t port = [] {
    signal(SIGPIPE, SIG_IGN);
    uint16_t p = 0;
    const int listener = Listen(&p);
    std::thread([listener] {
      for (;;) {
        const int fd = accept(listener, nullptr, nullptr);  // EINTR: tried again
        if (fd < 0) continue;
        char request[8];
        size_t got = 0;
        while (got < sizeof(request)) {
          const ssize_t n = recv(fd, request + got, sizeof(request) - got, 0);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          got += static_cast<size_t>(n);
        }
        std::string answer;
        {
          std::lock_guard l(g_mu);
          answer = g_answer;
        }
        for (size_t sent = 0; sent < answer.size();) {
          const ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          sent += static_cast<size_t>(n);
        }
        close(fd);
      }
    }).detach();
    return p;
  }();
  return port;
}

void CheckClient(std::string_view answer) {
  const uint16_t port = Peer();
  {
    std::lock_guard l(g_mu);
    g_answer = std::string(answer);
  }
  auto got = ferry::kv::FetchMetadata("127.0.0.1:" + std::to_string(port), std::chrono::seconds(5));
  if (answer.size() < 4) {
    if (got.ok() || got.status().code() != ferry::Code::kUnavailable) __builtin_trap();
    return;
  }
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(answer[i])) << (8 * i);
  if (len > kMaxHandshakeBytes) {
    if (got.ok() || got.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
  } else if (answer.size() - 4 < len) {
    if (got.ok() || got.status().code() != ferry::Code::kUnavailable) __builtin_trap();
  } else if (!got.ok() || *got != answer.substr(4, len)) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1)
    CheckClient(rest);
  else
    CheckServer(rest);
  return 0;
}
