// Messages with descriptors on the sockets of unix_socket.h: sendmsg / recvmsg with SCM_RIGHTS.
#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/unix_socket.h"

namespace ferry::os {
namespace {

// Milliseconds to poll for: what is left of `d`, at most `cap`, rounded up so a wait ends
// past the deadline rather than spinning just before it.
int PollMs(Deadline d, int64_t cap) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(d.remaining()).count();
  return static_cast<int>(left < cap ? left : cap);
}

// Waits until `fd` is readable: OK, kDeadlineExceeded, or kCancelled once wake_fd is readable.
Status WaitReadable(int fd, Deadline deadline, int wake_fd) {
  for (;;) {
    if (deadline.expired()) {
      // One last look, so that a message already there is not lost to timing.
      pollfd p{fd, POLLIN, 0};
      if (Env::Current()->Poll(&p, 1, 0) > 0) return Status::Ok();
      return Status(Code::kDeadlineExceeded, "socket wait passed its deadline");
    }
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int n = Env::Current()->Poll(p, wake_fd >= 0 ? 2 : 1, PollMs(deadline, 1000));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll", errno);
    }
    if (wake_fd >= 0 && (p[1].revents & POLLIN)) return Status(Code::kCancelled, "wait cancelled");
    if (p[0].revents) return Status::Ok();
  }
}

}  // namespace

Status SendMessage(int fd, std::string_view bytes, std::span<const int> fds, Deadline until) {
  if (bytes.size() > kMaxMessageBytes || fds.size() > kMaxMessageFds)
    return Status(Code::kInvalidArgument, "a message of " + std::to_string(bytes.size()) +
                                              " bytes and " + std::to_string(fds.size()) +
                                              " descriptors is too large to send");
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  Env* env = Env::Current();
  for (;;) {
    ssize_t n = env->SendMsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) return Status::Ok();
    if (n >= 0) return Status(Code::kInternal, "short send on a seqpacket socket");
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EMSGSIZE)
      return ErrnoStatus(Code::kInvalidArgument,
                         "message of " + std::to_string(bytes.size()) + " bytes", err);
    if (err != EAGAIN) return ErrnoStatus(Code::kUnavailable, "sending to the peer", err);
    // Full: the peer is not reading. Wait for room, at most until the deadline.
    if (until.expired())
      return Status(Code::kDeadlineExceeded, "the peer does not read its socket");
    pollfd p{fd, POLLOUT, 0};
    (void)env->Poll(&p, 1, PollMs(until, 100));
  }
}

Result<Received> ReceiveMessage(int fd, size_t max_bytes) {
  if (max_bytes > kMaxMessageBytes) max_bytes = kMaxMessageBytes;
  Received r;
  r.bytes.resize(max_bytes + 1);  // one more byte tells a message that does not fit
  iovec iov{r.bytes.data(), r.bytes.size()};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  Env* env = Env::Current();
  ssize_t n;
  for (int reset = 0;;) {
    n = env->RecvMsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    // A peer that closed with our message unread resets the connection, and the reset is
    // reported before the messages it sent first: read those once the reset is reported.
    if (n < 0 && errno == ECONNRESET && reset++ == 0) continue;
    break;
  }
  if (n < 0) {
    if (errno == EAGAIN) return Status(Code::kInProgress, "no message waiting");
    return ErrnoStatus(Code::kUnavailable, "receiving from the peer", errno);
  }
  // Take every descriptor first, so that none leaks on any error below.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      r.fds.emplace_back(got);
    }
  }
  if (n == 0 && r.fds.empty()) {
    // A zero-length read is the end of the connection, or an empty datagram from a peer that is
    // still connected (SOCK_SEQPACKET keeps them): the hang-up flag tells them apart.
    pollfd p{fd, POLLRDHUP, 0};
    if (env->Poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP)))
      return Status(Code::kUnavailable, "the peer closed the connection");
  }
  r.truncated =
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > max_bytes;
  r.bytes.resize(std::min<size_t>(static_cast<size_t>(n), max_bytes));
  return r;
}

Result<Received> WaitMessage(int fd, Deadline deadline, int wake_fd) {
  FERRY_RETURN_IF_ERROR(WaitReadable(fd, deadline, wake_fd));
  Result<Received> r = ReceiveMessage(fd, kMaxMessageBytes);
  if (!r.ok()) {
    if (r.status().code() == Code::kInProgress)
      return Status(Code::kDeadlineExceeded, "no message ready");
    return r.status();
  }
  if (r->truncated)
    return Status(Code::kInvalidArgument, "a message longer than " +
                                              std::to_string(kMaxMessageBytes) +
                                              " bytes or with more than " +
                                              std::to_string(kMaxMessageFds) + " descriptors");
  if (r->bytes.empty() && r->fds.empty()) return Status(Code::kInvalidArgument, "empty message");
  return r;
}

}  // namespace ferry::os
