// The kernel check's words (they reach users of GPUs this build was not made for), and, where
// a GPU is usable, that the kernels load on every device of this machine.
#include <gtest/gtest.h>

#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {

TEST(KernelCheck, DescribesCMakeArchitectureLists) {
  EXPECT_EQ(DescribeArchitectures("80-real;86-real;90-real;120"), "sm_80, sm_86, sm_90, sm_120 + PTX 120");
  EXPECT_EQ(DescribeArchitectures("90"), "sm_90 + PTX 90");
  EXPECT_EQ(DescribeArchitectures("100-virtual"), "PTX 100");
  EXPECT_EQ(DescribeArchitectures("native"), "native");
  EXPECT_EQ(DescribeArchitectures(";;"), "no architecture");
  EXPECT_EQ(DescribeArchitectures(""), "no architecture");
}

TEST(KernelCheck, MessageNamesDeviceBuildAndFix) {
  DeviceInfo a100{1, "NVIDIA A100-SXM4-80GB", 80ull << 30, 8, 0};
  EXPECT_EQ(KernelsUnsupportedMessage(a100, "90", "no kernel image is available for execution on the device"),
            "ferry's CUDA kernels cannot run on device 1 (NVIDIA A100-SXM4-80GB, sm_80): this build has code "
            "for sm_90 + PTX 90 only (no kernel image is available for execution on the device); rebuild "
            "ferry for it: cmake -DFERRY_CUDA_ARCHS=\"80-real\" (or a list with 80 in it; see README, CUDA "
            "architectures)");
  DeviceInfo rtx{0, "NVIDIA GeForce RTX 5090", 32ull << 30, 12, 0};
  const std::string m = KernelsUnsupportedMessage(rtx, "80-real;90-real", "");
  EXPECT_NE(m.find("(NVIDIA GeForce RTX 5090, sm_120): this build has code for sm_80, sm_90 only;"), std::string::npos) << m;
  EXPECT_NE(m.find("-DFERRY_CUDA_ARCHS=\"120-real\""), std::string::npos) << m;
}

TEST(KernelCheck, KernelsLoadOnEveryDeviceOrSayWhy) {
  if (!Available()) {
    EXPECT_EQ(KernelsLoad(0).code(), Built() ? Code::kFailedPrecondition : Code::kUnsupported);
    GTEST_SKIP() << "no usable GPU: " << UnavailableReason();
  }
  EXPECT_FALSE(BuiltArchitectures().empty());
  for (const DeviceInfo& d : Devices()) {
    const Status s = KernelsLoad(d.ordinal);
    // This build must carry code for the GPUs the tests run on; a refusal names the device.
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(KernelsLoad(d.ordinal).code(), s.code());  // cached, same answer
  }
  EXPECT_EQ(KernelsLoad(DeviceCount()).code(), Code::kInvalidArgument);
  EXPECT_EQ(KernelsLoad(-1).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::cuda
