#include "embed/service/unix_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace ferry::embed::service {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}
UniqueFd::~UniqueFd() { reset(); }
void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

Status Errno(std::string_view what) {
  int e = errno;
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(e);
  if (e == ECONNREFUSED || e == ENOENT || e == EPIPE || e == ECONNRESET)
    return Status(Code::kUnavailable, std::move(msg));
  if (e == EAGAIN || e == EWOULDBLOCK)
    return Status(Code::kResourceExhausted, std::move(msg) + " (the peer does not read)");
  return Status(Code::kInternal, std::move(msg));
}

Result<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status(Code::kInvalidArgument, "socket path '" + path + "' is empty or too long");
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// Waits until `fd` is readable: OK, kDeadlineExceeded, or kCancelled when wake_fd is readable.
Status WaitReadable(int fd, Deadline deadline, int wake_fd) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
    if (left.count() <= 0 && deadline.expired()) {
      // One last non-blocking look, so a ready message is not lost to timing.
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) return Status::Ok();
      return Status(Code::kDeadlineExceeded, "socket wait passed its deadline");
    }
    int timeout = left.count() > 1000 ? 1000 : static_cast<int>(left.count()) + 1;
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int n = ::poll(p, wake_fd >= 0 ? 2 : 1, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (wake_fd >= 0 && (p[1].revents & POLLIN)) return Status(Code::kCancelled, "wait cancelled");
    if (p[0].revents) return Status::Ok();
  }
}

UniqueFd Socket() { return UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)); }

}  // namespace

Result<PathState> ProbeSocketPath(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Errno("lstat " + path);
    // Nothing there; the folder must exist for a bind to succeed.
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
      return Status(Code::kNotFound, "socket path " + path + ": folder " + dir + " does not exist");
    return PathState::kFree;
  }
  if (!S_ISSOCK(st.st_mode)) return PathState::kNotSocket;
  // A socket: live when something accepts (or queues) a connection there. A listener of another
  // socket type (EPROTOTYPE) is live too.
  UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return Errno("socket");
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
    return PathState::kLive;
  if (errno == ECONNREFUSED || errno == ENOENT) return PathState::kStale;
  return PathState::kLive;  // EAGAIN (a full backlog), EPROTOTYPE, EINPROGRESS, ...
}

namespace {
Status ListenError(const std::string& path, PathState state) {
  if (state == PathState::kLive)
    return Status(Code::kAlreadyExists,
                  "socket path " + path + ": another service accepts connections there");
  if (state == PathState::kNotSocket)
    return Status(Code::kFailedPrecondition,
                  "socket path " + path + " exists and is not a socket; remove it or pick another");
  return Status::Ok();
}
}  // namespace

Status CheckListenPath(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(PathState state, ProbeSocketPath(path));
  return ListenError(path, state);
}

Result<UniqueFd> Listen(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  FERRY_ASSIGN_OR_RETURN(PathState state, ProbeSocketPath(path));
  FERRY_RETURN_IF_ERROR(ListenError(path, state));
  UniqueFd fd = Socket();
  if (!fd.valid()) return Errno("socket");
  if (state == PathState::kStale) ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return Errno("bind " + path);
  if (::listen(fd.get(), 128) != 0) return Errno("listen " + path);
  return fd;
}

Result<UniqueFd> Connect(const std::string& path, Deadline deadline) {
  FERRY_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  for (;;) {
    UniqueFd fd = Socket();
    if (!fd.valid()) return Errno("socket");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    Status s = Errno("connect " + path);
    if (s.code() != Code::kUnavailable) return s;
    if (deadline.expired())
      return Status(Code::kUnavailable, std::string(s.message()) + " (until the deadline)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<UniqueFd> Accept(int listen_fd, Deadline deadline, int wake_fd, bool nonblocking) {
  FERRY_RETURN_IF_ERROR(WaitReadable(listen_fd, deadline, wake_fd));
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0));
  if (fd < 0) return Errno("accept");
  return UniqueFd(fd);
}

Status Send(int fd, std::string_view bytes, std::span<const int> fds) {
  if (bytes.size() > kMaxMessageBytes || fds.size() > kMaxMessageFds)
    return Status(Code::kInvalidArgument, "message or descriptor list too large to send");
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return Status::Ok();
    if (errno == EINTR) continue;
    return Errno("sendmsg");
  }
}

Result<Message> Receive(int fd, Deadline deadline, int wake_fd) {
  FERRY_RETURN_IF_ERROR(WaitReadable(fd, deadline, wake_fd));
  Message out;
  out.bytes.resize(kMaxMessageBytes + 1);
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  for (int reset = 0;;) {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    // A peer that closed with our message unread resets the connection, and the reset is
    // reported before the messages it sent first: read those once the reset is reported.
    if (n < 0 && errno == ECONNRESET && reset++ == 0) continue;
    break;
  }
  if (n < 0) {
    if (errno == EAGAIN) return Status(Code::kDeadlineExceeded, "no message ready");
    return Errno("recvmsg");
  }
  // Take ownership of every descriptor first, so that none leaks on any error below.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(received);
    }
  }
  if (n == 0 && out.fds.empty()) {
    // A zero-length read is the end of the connection, or an empty datagram from a peer that is
    // still connected (SOCK_SEQPACKET keeps them): the hang-up flag tells them apart.
    pollfd p{fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP)))
      return Status(Code::kUnavailable, "peer closed the connection");
    return Status(Code::kInvalidArgument, "empty message");
  }
  if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > kMaxMessageBytes)
    return Status(Code::kInvalidArgument,
                  "message larger than " + std::to_string(kMaxMessageBytes) + " bytes");
  if (msg.msg_flags & MSG_CTRUNC)
    return Status(Code::kInvalidArgument, "too many descriptors in one message");
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

Result<UniqueFd> MakeWakeFd() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return Errno("eventfd");
  return UniqueFd(fd);
}

void SignalWakeFd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof(one));
  (void)n;
}

}  // namespace ferry::embed::service
