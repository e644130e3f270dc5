#include "transport/ucx/listen_socket.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ferry::internal::ucx {

namespace {

// Calls fn(fd, listening) for each TCP socket of this process whose local port is `port`, until
// fn returns false.
template <typename Fn>
void ForEachSocketOnPort(uint16_t port, Fn fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0)
      continue;  // not a socket
    int type = 0;
    len = sizeof(type);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage addr = {};
    socklen_t addr_len = sizeof(addr);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) continue;
    uint16_t bound = 0;
    if (addr.ss_family == AF_INET)
      bound = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    else if (addr.ss_family == AF_INET6)
      bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    else
      continue;
    if (bound == port && !fn(static_cast<int>(fd), listening != 0)) break;
  }
  closedir(dir);
}

}  // namespace

int FindListeningSocket(uint16_t port) {
  int found = -1;
  ForEachSocketOnPort(port, [&](int fd, bool listening) {
    if (listening) found = fd;
    return !listening;
  });
  return found;
}

int CountAcceptedConnections(uint16_t port) {
  int n = 0;
  ForEachSocketOnPort(port, [&](int, bool listening) {
    if (!listening) ++n;
    return true;
  });
  return n;
}


}  // namespace ferry::internal::ucx
