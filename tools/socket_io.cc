#include "socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;

// errno is read first: building the message may allocate, and that may set it.
Status Errno(std::string_view prefix, const char* what) {
  const int err = errno;
  return Status(Code::kUnavailable, std::string(prefix) + what + ": " + std::strerror(err));
}

}  // namespace

int PollMillisUntil(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

Status SendAllBy(int fd, std::string_view data, Clock::time_point until,
                 const SendMessages& messages, int wake_fd) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return Errno(messages.prefix, "send");
    // The socket is full: wait for room (or the wake fd) until the deadline; a wait that
    // times out comes back here past it.
    if (Clock::now() >= until)
      return Status(Code::kDeadlineExceeded, std::string(messages.deadline));
    pollfd p[2] = {{fd, POLLOUT, 0}, {wake_fd, POLLIN, 0}};
    const int r = poll(p, wake_fd >= 0 ? 2 : 1, PollMillisUntil(until));
    if (r < 0 && errno != EINTR) return Errno(messages.prefix, "poll");
    if (r > 0 && wake_fd >= 0 && p[1].revents)
      return Status(Code::kAborted, std::string(messages.woken));
  }
  return Status::Ok();
}

}  // namespace ferry::tools
