// ValidateServerOptions: the bounds of ServerOptions (ferry/embed_server.h).
#include <string>

#include "embed/checks.h"
#include "ferry/embed_server.h"

namespace ferry::embed::service {

Status ValidateServerOptions(const ServerOptions& o) {
  if (o.socket_path.empty()) return Status(Code::kInvalidArgument, "the service needs a socket path");
  if (o.wait_timeout <= std::chrono::nanoseconds::zero() || o.wait_timeout > kMaxWaitTimeout)
    return Status(Code::kInvalidArgument,
                  "wait timeout " + std::to_string(o.wait_timeout.count()) +
                      " ns outside (0, " + std::to_string(kMaxWaitTimeout.count()) + " s]");
  FERRY_RETURN_IF_ERROR(
      CheckInRange("max queued steps", o.max_queued_steps, size_t{1}, kMaxQueuedSteps));
  if (o.min_copy_bytes < 1) return Status(Code::kInvalidArgument, "min copy bytes must be >= 1");
  FERRY_RETURN_IF_ERROR(
      CheckInRange("max connections", o.max_connections, size_t{1}, kMaxConnections));
  FERRY_RETURN_IF_ERROR(CheckInRange("pump cpus", o.pump_cpus, -1, kMaxPumpCpus));
  FERRY_RETURN_IF_ERROR(ValidateGatherOptions(o.gather));
  return ValidateStepPolicyOptions(o.policy);
}

}  // namespace ferry::embed::service
