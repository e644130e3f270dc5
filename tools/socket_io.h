// Sending on a stream socket by a deadline, shared by the tools that talk TCP with only ferry's
// public headers (the side channel, the metrics server and its client): a peer that stops
// reading fills its socket, and a plain blocking send would then hold the thread for ever.
//
// Thread safety: free functions; one thread per socket.
#pragma once

#include <chrono>
#include <string_view>

#include "ferry/status.h"

namespace ferry::tools {

// The wait until `until` as poll() takes it: [0, 2^30] ms, rounded up, so that a wait that
// times out ends at or past `until` (the caller's next check of the deadline then ends its loop
// rather than polling again with a timeout of 0).
int PollMillisUntil(std::chrono::steady_clock::time_point until);

// What SendAllBy's failures say, in its caller's words (so that each keeps its own messages).
struct SendMessages {
  std::string_view prefix;      // before "send: <errno>" and "poll: <errno>" (kUnavailable)
  std::string_view deadline;    // kDeadlineExceeded: the peer took no more bytes by the deadline
  std::string_view woken = "";  // kAborted: `wake_fd` became readable (only with a wake_fd)
};

// Sends all of `data` on `fd` by `until`, without blocking in send (MSG_DONTWAIT, so `fd` may
// be a blocking socket) and without SIGPIPE (MSG_NOSIGNAL: a closed peer is an error, not the
// end of the process). While the socket is full it polls for room; a signal (EINTR) only
// retries. A `wake_fd` (>= 0) that becomes readable ends the wait at once (a server that stops).
// kUnavailable when send or poll fails, kDeadlineExceeded once `until` has passed.
Status SendAllBy(int fd, std::string_view data, std::chrono::steady_clock::time_point until,
                 const SendMessages& messages, int wake_fd = -1);

}  // namespace ferry::tools
