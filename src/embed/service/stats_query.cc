// QueryStats (ferry/embed_stats.h): a StatsRequest on a connection of its own.
#include <chrono>

#include "base/deadline.h"
#include "embed/service/protocol.h"
#include "embed/service/unix_socket.h"
#include "ferry/embed_stats.h"

namespace ferry::embed::service {

Result<ServerStats> QueryStats(const std::string& socket_path, bool reset,
                               std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero() || timeout > kMaxQueryTimeout)
    return Status(Code::kInvalidArgument,
                  "a stats query's timeout must be in (0, " +
                      std::to_string(kMaxQueryTimeout.count()) + " s], not " +
                      std::to_string(timeout.count()) + " ns");
  const Deadline deadline = Deadline::After(timeout);
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, Connect(socket_path, deadline));
  Status sent = Send(fd.get(), Encode(StatsRequest{reset}));
  Result<Message> received =
      Receive(fd.get(), sent.ok() ? deadline : Deadline::After(std::chrono::milliseconds(100)));
  if (!received.ok()) return sent.ok() ? received.status() : sent;
  Message& answer = *received;
  Result<AnyMessage> decoded = Decode(answer.bytes);
  if (!decoded.ok()) return decoded.status();
  if (const Registered* refused = std::get_if<Registered>(&decoded.value());
      refused != nullptr && !refused->status.ok())
    return refused->status;  // the service serves as many connections as it may
  Stats* stats = std::get_if<Stats>(&decoded.value());
  if (stats == nullptr)
    return Status(Code::kInvalidArgument,
                  "the service answered a stats request with another message");
  return std::move(stats->stats);
}

}  // namespace ferry::embed::service
