// TCP sockets on 127.0.0.1 for tests that speak to a listener directly (hostile bytes, idle
// connections, the ucx door): a listener on a port the kernel picks, and a connect to a port.
//
// Thread safety: plain functions and a value owned by one test.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace ferry::testing {

inline sockaddr_in LoopbackAddress(uint16_t port) {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  return a;
}

// A listening TCP socket on loopback, port picked by the kernel; closed with the object
// unless the test closed it and set fd to -1.
struct LoopbackListener {
  int fd = -1;
  uint16_t port = 0;
  explicit LoopbackListener(int backlog = 16) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = LoopbackAddress(0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd, backlog), 0);
    socklen_t len = sizeof(a);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
  }
  ~LoopbackListener() {
    if (fd >= 0) close(fd);
  }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;
};

// A new socket (SOCK_STREAM | `flags`) and connect()'s result for 127.0.0.1:`port`; with
// SOCK_NONBLOCK the result may be -1 with errno EINPROGRESS.
struct Dialed {
  int fd;
  int rc;
};
inline Dialed DialLoopback(uint16_t port, int flags = 0) {
  int fd = socket(AF_INET, SOCK_STREAM | flags, 0);
  sockaddr_in a = LoopbackAddress(port);
  return {fd, connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a))};
}

}  // namespace ferry::testing
