// Unix-domain SOCK_SEQPACKET sockets with descriptor passing: the control channel of the `shm`
// transport (abstract addresses) and of the embedding-offload service (filesystem paths).
//
// Each send is one message: boundaries are kept, so a short read is a truncated message, never
// a partial one, and file descriptors travel with a message as SCM_RIGHTS ancillary data.
// Every socket made here is non-blocking and close-on-exec; sends and receives never block
// past their deadline. Every call goes through the OS seam (base/os.h).
//
// Errors: kUnavailable once the peer is gone (or nothing listens at an address),
// kInProgress when a non-blocking call finds nothing to do, kDeadlineExceeded, kCancelled
// (a wake descriptor ended a wait), kInvalidArgument for a message or descriptor list over the
// limits, and the codes of os::ErrnoCode for other failures.
//
// Thread safety: free functions, callable from any thread. Sends on one socket from several
// threads are atomic per message (the kernel's guarantee); receive on a socket from one thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/deadline.h"
#include "base/unique_fd.h"
#include "ferry/status.h"

namespace ferry::os {

// The largest message and descriptor list one message may carry.
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr size_t kMaxMessageFds = 8;

// Where a socket listens: a filesystem path, or a name in the abstract namespace (no file on
// disk; gone with the process).
struct UnixAddress {
  static UnixAddress Path(std::string path) { return {std::move(path), false}; }
  static UnixAddress Abstract(std::string name) { return {std::move(name), true}; }
  std::string name;
  bool abstract = false;
};

// What is at a path a socket would be bound to.
enum class PathState {
  kFree,       // nothing: a socket may be bound there
  kStale,      // a socket that nobody accepts on: it may be replaced
  kLive,       // a socket that a live process accepts on
  kNotSocket,  // a file, folder, FIFO, ...
};
// kInvalidArgument for an empty path or one longer than sun_path; kNotFound when the folder it
// names does not exist.
Result<PathState> ProbeSocketPath(const std::string& path);
// Checks that `path` may be listened on: kAlreadyExists for a socket a live process accepts
// on, kFailedPrecondition for anything there that is not a socket, and ProbeSocketPath's errors.
Status CheckListenPath(const std::string& path);

// Binds and listens on `address`; at a path only after CheckListenPath (a stale socket there
// is replaced).
Result<UniqueFd> ListenUnix(const UnixAddress& address);
// Connects to `address`, retrying while nothing listens there yet until `retry_until`;
// kUnavailable when nothing does by then.
Result<UniqueFd> ConnectUnix(const UnixAddress& address, Deadline retry_until);
// Accepts one waiting connection; kInProgress when none is waiting.
Result<UniqueFd> AcceptUnix(int listen_fd);
// The user id of the process at the other end.
Result<uid_t> PeerUid(int fd);
// Whether the process behind `fd` may connect: this process's user, or one in `allowed`.
// False when its user cannot be read. *peer: its user id, -1 when it cannot be read.
bool PeerUserAllowed(int fd, std::span<const uint32_t> allowed, int64_t* peer = nullptr);

// Sends one message with `fds` attached, waiting for room in the socket until `until`
// (a default Deadline waits as long as the peer takes). kDeadlineExceeded when the socket stays
// full until then, kUnavailable once the peer is gone, kInvalidArgument (nothing sent) for a
// message over the limits.
Status SendMessage(int fd, std::string_view bytes, std::span<const int> fds = {},
                   Deadline until = Deadline());

struct Received {
  std::string bytes;
  std::vector<UniqueFd> fds;  // every descriptor that came with the message
  bool truncated = false;     // longer than asked for, or descriptors were cut off
};
// Receives one waiting message of at most `max_bytes` (<= kMaxMessageBytes) without waiting.
// kInProgress when none is waiting, kUnavailable when the peer closed the connection. An empty
// datagram from a peer still connected is an empty message.
Result<Received> ReceiveMessage(int fd, size_t max_bytes);
// Waits for one message until `deadline` (kDeadlineExceeded), or until `wake_fd` (when >= 0)
// is readable (kCancelled), and receives it whole: kInvalidArgument for an empty message, one
// longer than kMaxMessageBytes or with descriptors cut off (it is consumed, its descriptors
// closed).
Result<Received> WaitMessage(int fd, Deadline deadline, int wake_fd = -1);

// An eventfd for waking waiters; SignalWakeFd makes it readable for good.
Result<UniqueFd> MakeWakeFd();
void SignalWakeFd(int fd);

}  // namespace ferry::os
