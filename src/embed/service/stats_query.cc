#include "embed/service/stats_query.h"

#include "embed/service/protocol.h"
#include "embed/service/unix_socket.h"

namespace ferry::embed::service {

Result<ServerStats> QueryStats(const std::string& socket_path, bool reset, Deadline deadline) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, Connect(socket_path, deadline));
  FERRY_RETURN_IF_ERROR(Send(fd.get(), Encode(StatsRequest{reset})));
  FERRY_ASSIGN_OR_RETURN(Message answer, Receive(fd.get(), deadline));
  Result<AnyMessage> decoded = Decode(answer.bytes);
  if (!decoded.ok()) return decoded.status();
  Stats* stats = std::get_if<Stats>(&decoded.value());
  if (stats == nullptr)
    return Status(Code::kInvalidArgument,
                  "the service answered a stats request with another message");
  return std::move(stats->stats);
}

}  // namespace ferry::embed::service
