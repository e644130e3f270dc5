// The embedding-offload protocol's sockets: base/unix_socket.h (the one Unix-socket layer,
// shared with the `shm` transport) as the service and its clients use it. Their sockets live at
// filesystem paths; a client's send waits for room as long as the service takes (a server's
// sends do not wait: server_internal.h); every receive has a deadline and an optional wake
// descriptor; a message is at most os::kMaxMessageBytes with os::kMaxMessageFds descriptors.
//
// Thread safety: as base/unix_socket.h.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "base/unix_socket.h"

namespace ferry::embed::service {

using os::kMaxMessageBytes;
using os::kMaxMessageFds;
using os::MakeWakeFd;
using os::PathState;
using os::ProbeSocketPath;
using os::SignalWakeFd;
using os::UniqueFd;
using Message = os::Received;

// Listens at `path` (a stale socket there is replaced; a live one is kAlreadyExists).
inline Result<UniqueFd> Listen(const std::string& path) {
  return os::ListenUnix(os::UnixAddress::Path(path));
}
// Connects to `path`, retrying while nothing listens there yet, until `deadline`.
inline Result<UniqueFd> Connect(const std::string& path, Deadline deadline) {
  return os::ConnectUnix(os::UnixAddress::Path(path), deadline);
}
// Sends one message, waiting for room as long as the peer takes.
inline Status Send(int fd, std::string_view bytes, std::span<const int> fds = {}) {
  return os::SendMessage(fd, bytes, fds, Deadline());
}
// One whole message, by `deadline` (see os::WaitMessage).
inline Result<Message> Receive(int fd, Deadline deadline, int wake_fd = -1) {
  return os::WaitMessage(fd, deadline, wake_fd);
}

}  // namespace ferry::embed::service
