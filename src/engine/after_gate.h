// AfterGate: holds a transfer's completion, and the notification it carries, until other
// transfers have finished: the earlier writes of its session (a write batch's notification
// follows them) and the transfers named in TransferOptions::after (which may belong to other
// sessions, e.g. one session per KV layer). The notification leaves once the transfer's own
// data is in place and each of those finished OK; if one failed, it is not sent and the
// transfer fails with that one's error.
//
// Thread safety: Install() before the transfer is posted; the rest runs on whichever threads
// finish the transfers involved.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/transfer_state.h"
#include "transport/transport.h"

namespace ferry::internal {

// A transfer the gated one waits for, and how its failure is reported ("earlier write 7 of
// this session", "transfer 9 named in `after`").
struct GateInput {
  std::shared_ptr<TransferState> state;
  std::string what;
};

// Sets `state`'s continuation: once its parts succeed and every input finished OK, `wire` (a
// framed notification, if any) goes to `endpoint` as one more part of `state`.
// REQUIRES: called before `state` is posted; `endpoint` non-null when `wire` is set.
void InstallAfterGate(const std::shared_ptr<TransferState>& state, std::vector<GateInput> inputs,
                      std::shared_ptr<Endpoint> endpoint, std::optional<std::string> wire);

}  // namespace ferry::internal
