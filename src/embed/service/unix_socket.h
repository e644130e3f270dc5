// Unix-domain SOCK_SEQPACKET sockets for the embedding-offload protocol: each send is one
// message (boundaries kept, so a short read is a truncated message, never a partial one),
// and file descriptors travel with a message as SCM_RIGHTS ancillary data.
//
// Every receive has a deadline and an optional wake descriptor (an eventfd or pipe that, once
// readable, ends the wait with kCancelled), so no thread blocks forever on a silent peer.
// Errors: kUnavailable when the peer closed the connection (or the path has no listener),
// kDeadlineExceeded, kInvalidArgument for an empty message or a message or descriptor list
// larger than the limits (the message is consumed and its descriptors closed),
// kResourceExhausted when a non-blocking socket cannot take a message now (the peer does not
// read), kInternal for other socket errors.
//
// Thread safety: UniqueFd is a value owning one descriptor. The functions may be called from
// any thread; concurrent sends on one socket are atomic per message (the kernel's guarantee).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/deadline.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_ = -1;
};

inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr size_t kMaxMessageFds = 8;

// What is at a path a service would listen on.
enum class PathState {
  kFree,       // nothing: a socket may be bound there
  kStale,      // a socket that nobody accepts on: it may be replaced
  kLive,       // a socket that a live service accepts on
  kNotSocket,  // a file, folder, FIFO, ...
};
// kInvalidArgument for an empty path or one longer than sun_path; kNotFound when the folder it
// names does not exist; kInternal for other errors of lstat.
Result<PathState> ProbeSocketPath(const std::string& path);
// Checks that `path` may be listened on: kAlreadyExists for a socket a live service accepts on,
// kFailedPrecondition for anything there that is not a socket, and the errors of
// ProbeSocketPath.
Status CheckListenPath(const std::string& path);

// Binds and listens on `path`, after CheckListenPath: only a stale socket there is replaced.
Result<UniqueFd> Listen(const std::string& path);
// Connects to `path`, retrying while nothing listens there yet, until `deadline`.
Result<UniqueFd> Connect(const std::string& path, Deadline deadline);
// Accepts one connection; kDeadlineExceeded / kCancelled as for Receive. `nonblocking`: the
// connection is O_NONBLOCK (Send returns kResourceExhausted rather than wait for the peer).
Result<UniqueFd> Accept(int listen_fd, Deadline deadline, int wake_fd = -1,
                        bool nonblocking = false);

// REQUIRES: bytes.size() <= kMaxMessageBytes, fds.size() <= kMaxMessageFds.
Status Send(int fd, std::string_view bytes, std::span<const int> fds = {});

struct Message {
  std::string bytes;
  std::vector<UniqueFd> fds;
};
Result<Message> Receive(int fd, Deadline deadline, int wake_fd = -1);

// An eventfd for waking receivers; Signal() makes it readable for good.
Result<UniqueFd> MakeWakeFd();
void SignalWakeFd(int fd);

}  // namespace ferry::embed::service
