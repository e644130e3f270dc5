// QueryStats: asks a running `ferry embed-serve` for its counters and per-step phase timings
// (ServerStats, step_stats.h) over its Unix socket, on a connection of its own that registers
// nothing (the protocol's StatsRequest). Used by `ferry bench-embed` and monitoring scripts.
//
// Thread safety: a pure function of its arguments.
#pragma once

#include <string>

#include "base/deadline.h"
#include "embed/service/step_stats.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// reset: the service clears its phase timings after answering. kUnavailable when no service
// answers, kDeadlineExceeded past the deadline, kInvalidArgument for a malformed answer.
Result<ServerStats> QueryStats(const std::string& socket_path, bool reset, Deadline deadline);

}  // namespace ferry::embed::service
