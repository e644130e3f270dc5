// Which UCX transports this process may use, and whether one-sided RMA is native on them.
//
// UCX emulates put/get over TCP through its active-message machinery, at a small fraction of
// the link's speed (over loopback here: 0.6 GB/s at 1 MiB, 0.04 GB/s at 64 MiB, against about
// 5 GB/s for tag or AM sends). ferry therefore uses native RMA only where a UCX transport has it
// (shared memory and cross-memory attach within a host, RDMA verbs across hosts) and carries
// writes and reads as active messages elsewhere.
#pragma once

#include <set>
#include <string>
#include <string_view>

namespace ferry::internal::ucx {

struct RmaPolicy {
  // posix/sysv/cma/xpmem/knem enabled. Informative: ferry does not use RMA on them by default,
  // as UCX's put into memory it did not allocate was slower than active messages here.
  bool same_host_native = false;
  bool network_native = false;  // rc/dc verbs or mlx5 enabled: ferry uses RMA
};

// `available`: transport names UCX reports on this machine (uct resources, e.g. "posix",
// "tcp", "rc_mlx5"); `tls`: the value of UCX_TLS ("" or "all" = no restriction; a
// comma-separated list, "^" in front excludes; aliases shm, sm, rc, dc, ud, ib, mm).
RmaPolicy DecideRma(const std::set<std::string>& available, std::string_view tls);

// The UCT transport names present on this machine.
std::set<std::string> AvailableUctTransports();

}  // namespace ferry::internal::ucx
