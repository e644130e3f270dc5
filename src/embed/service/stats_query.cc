#include "embed/service/stats_query.h"

#include "embed/service/protocol.h"
#include "embed/service/unix_socket.h"

namespace ferry::embed::service {

Result<ServerStats> QueryStats(const std::string& socket_path, bool reset, Deadline deadline) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, Connect(socket_path, deadline));
  FERRY_RETURN_IF_ERROR(Send(fd.get(), Encode(StatsRequest{reset})));
  FERRY_ASSIGN_OR_RETURN(Message answer, Receive(fd.get(), deadline));
  FERRY_ASSIGN_OR_RETURN(AnyMessage decoded, Decode(answer.bytes));
  if (!std::holds_alternative<Stats>(decoded))
    return Status(Code::kInvalidArgument,
                  "the service answered a stats request with another message");
  return std::get<Stats>(decoded).stats;
}

}  // namespace ferry::embed::service
