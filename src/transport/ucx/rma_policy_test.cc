#include "transport/ucx/rma_policy.h"

#include <gtest/gtest.h>

namespace ferry::internal::ucx {
namespace {

const std::set<std::string> kDevVm = {"self", "tcp", "posix", "sysv", "cma"};
const std::set<std::string> kRdmaHost = {"self", "tcp", "posix", "cma", "rc_mlx5", "dc_mlx5", "ud_mlx5"};

TEST(RmaPolicy, SharedMemoryIsNativeOnOneHostTcpIsNot) {
  RmaPolicy p = DecideRma(kDevVm, "");
  EXPECT_TRUE(p.same_host_native);
  EXPECT_FALSE(p.network_native);
  EXPECT_TRUE(DecideRma(kDevVm, "all").same_host_native);
}

TEST(RmaPolicy, UcxTlsRestrictsTheChoice) {
  EXPECT_FALSE(DecideRma(kDevVm, "tcp").same_host_native);
  EXPECT_TRUE(DecideRma(kDevVm, "tcp,shm").same_host_native);
  EXPECT_TRUE(DecideRma(kDevVm, "sm,self").same_host_native);
  EXPECT_TRUE(DecideRma(kDevVm, "cma").same_host_native);
  EXPECT_FALSE(DecideRma(kDevVm, "^shm").same_host_native);
  EXPECT_TRUE(DecideRma(kDevVm, "^tcp").same_host_native);
}

TEST(RmaPolicy, RdmaIsNativeEverywhere) {
  RmaPolicy p = DecideRma(kRdmaHost, "");
  EXPECT_TRUE(p.network_native);
  EXPECT_TRUE(p.same_host_native);
  EXPECT_TRUE(DecideRma(kRdmaHost, "rc,tcp").network_native);
  EXPECT_FALSE(DecideRma(kRdmaHost, "ud,tcp,shm").network_native);
  EXPECT_FALSE(DecideRma(kRdmaHost, "^ib").network_native);
}

TEST(RmaPolicy, ThisMachineReportsTransports) {
  auto available = AvailableUctTransports();
  EXPECT_FALSE(available.empty());
}

}  // namespace
}  // namespace ferry::internal::ucx
