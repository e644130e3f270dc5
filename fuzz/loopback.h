// Socket helpers for the fuzz targets that talk to a server over loopback. They wait through
// signals: libFuzzer's timer (SIGALRM, every -timeout/2 s) interrupts whatever call is blocked
// then, and a harness that took that for a failure would report a finding that is not one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string_view>

namespace fuzz {

// A connected TCP socket to 127.0.0.1:port; traps when the server does not take it.
inline int DialLoopback(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) __builtin_trap();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (errno != EINTR) __builtin_trap();
  // Interrupted: the connection goes on; wait for it and read its outcome.
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    const int r = poll(&p, 1, 5000);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) __builtin_trap();
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) __builtin_trap();
    return fd;
  }
}

// Writes all of `bytes` (a few KiB at most: the socket buffers take them); traps on failure.
inline void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) __builtin_trap();
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace fuzz
