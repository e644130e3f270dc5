#include "transport/shm/socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace ferry::internal::shm {
namespace {

// Descriptors accepted in one message; more are cut off by the kernel (and closed).
constexpr size_t kMaxFds = 4;

Status Errno(Code code, const std::string& what) {
  return Status(code, what + ": " + std::strerror(errno));
}

Result<socklen_t> Address(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr->sun_path))
    return Status(Code::kInvalidArgument, "bad shm socket name of " + std::to_string(name.size()) + " bytes");
  addr->sun_path[0] = '\0';  // abstract namespace
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace

Result<int> ListenAbstract(const std::string& name) {
  sockaddr_un addr;
  FERRY_ASSIGN_OR_RETURN(socklen_t len, Address(name, &addr));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno(Code::kUnavailable, "socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    Status s = Errno(Code::kUnavailable, "listening on the shm socket");
    close(fd);
    return s;
  }
  return fd;
}

Result<int> DialAbstract(const std::string& name) {
  sockaddr_un addr;
  FERRY_ASSIGN_OR_RETURN(socklen_t len, Address(name, &addr));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno(Code::kUnavailable, "socket");
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    Status s = Errno(Code::kUnavailable, "connecting to the shm socket");
    close(fd);
    return s;
  }
  return fd;
}

Result<int> AcceptOne(int listen_fd) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) return fd;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
    return Status(Code::kInProgress, "no connection waiting");
  return Errno(Code::kUnavailable, "accept");
}

Result<uid_t> PeerUid(int fd) {
  ucred cred = {};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno(Code::kUnavailable, "SO_PEERCRED");
  return cred.uid;
}

Status SendMessage(int fd, std::string_view bytes, std::span<const int> pass_fds, Deadline until) {
  if (pass_fds.size() > kMaxFds) return Status(Code::kInvalidArgument, "too many descriptors for one message");
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!pass_fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * pass_fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * pass_fds.size());
    std::memcpy(CMSG_DATA(c), pass_fds.data(), sizeof(int) * pass_fds.size());
  }
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) return Status::Ok();
    if (n >= 0) return Status(Code::kInternal, "short send on a seqpacket socket");
    if (errno == EINTR) continue;
    if (errno == EMSGSIZE) return Errno(Code::kInvalidArgument, "message of " + std::to_string(bytes.size()) + " bytes");
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno(Code::kUnavailable, "sending to the peer");
    // Full: the peer is not reading. Wait for room, at most until the deadline.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until.remaining()).count();
    if (left <= 0) return Status(Code::kDeadlineExceeded, "the peer does not read its socket");
    pollfd p{fd, POLLOUT, 0};
    (void)poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
  }
}

Result<Received> ReceiveMessage(int fd, size_t max_bytes) {
  Received r;
  r.bytes.resize(max_bytes + 1);  // one more byte tells a message that does not fit
  iovec iov{r.bytes.data(), r.bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status(Code::kInProgress, "no message waiting");
    return Errno(Code::kUnavailable, "receiving from the peer");
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      r.fds.push_back(got);
    }
  }
  if (n == 0 && r.fds.empty()) return Status(Code::kUnavailable, "the peer closed the connection");
  r.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > max_bytes;
  r.bytes.resize(std::min<size_t>(static_cast<size_t>(n), max_bytes));
  return r;
}

}  // namespace ferry::internal::shm
