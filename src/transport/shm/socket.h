// Unix-domain SOCK_SEQPACKET sockets in the abstract namespace, for the `shm` transport: one
// message per record, file descriptors passed with SCM_RIGHTS. Every socket is non-blocking;
// a send that finds the socket full waits for room until its deadline.
//
// Thread safety: free functions; one socket may be sent on from several threads (each message
// is one sendmsg) but received on from one.
#pragma once

#include <sys/types.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/deadline.h"
#include "ferry/status.h"

namespace ferry::internal::shm {

// Listens on the abstract address `name` (no file on disk; gone with the process).
Result<int> ListenAbstract(const std::string& name);
// Connects to the abstract address `name`; kUnavailable when nobody listens there.
Result<int> DialAbstract(const std::string& name);
// Accepts one connection (non-blocking); kInProgress when none is waiting.
Result<int> AcceptOne(int listen_fd);
// The user id of the process at the other end.
Result<uid_t> PeerUid(int fd);

// Sends one message with `pass_fds` (at most 4) attached. kUnavailable once the peer is gone,
// kDeadlineExceeded when the socket stays full until `until`, kInvalidArgument when the
// message is larger than the socket takes.
Status SendMessage(int fd, std::string_view bytes, std::span<const int> pass_fds, Deadline until);

struct Received {
  std::string bytes;
  std::vector<int> fds;    // every descriptor that came with the message; the caller owns them
  bool truncated = false;  // the message was longer than asked for (or its descriptors were cut)
};
// Receives one message of at most `max_bytes`. kInProgress when none is waiting, kUnavailable
// when the peer closed the connection.
Result<Received> ReceiveMessage(int fd, size_t max_bytes);

}  // namespace ferry::internal::shm
