// Connecting to a Unix socket as another user, for tests of the SO_PEERCRED checks (the shm
// transport's socket, the embedding service's). Needs root to change user.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace ferry::testing {

inline constexpr uid_t kNobody = 65534;

// In a child that becomes user (and group) `uid`, connects a SOCK_SEQPACKET socket to `name`
// (an abstract name, or a path) and waits up to `wait_ms` for the other side to close it.
// Returns the child's exit status: 0 closed (refused), 1 still open, 2 no connection, 3 could
// not change user; -1 when the child could not run. Only system calls after fork: the caller
// has threads.
inline int ConnectAsUser(uid_t uid, const std::string& name, bool abstract, int wait_ms) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(addr.sun_path)) return -1;
  std::memcpy(addr.sun_path + (abstract ? 1 : 0), name.data(), name.size());
  const auto len = static_cast<socklen_t>(abstract ? offsetof(sockaddr_un, sun_path) + 1 + name.size() : sizeof(addr));
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (syscall(SYS_setgid, uid) != 0 || syscall(SYS_setuid, uid) != 0) _exit(3);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(2);
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) <= 0) _exit(1);
    char c;
    _exit(recv(fd, &c, 1, MSG_DONTWAIT) <= 0 ? 0 : 1);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace ferry::testing
