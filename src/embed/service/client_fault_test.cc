// The embedding service's client under faults injected through the OS seam (base/os.h): a
// request whose sendmsg fails ends the step and the connection with UNAVAILABLE, and the
// client leaves no descriptor behind.
#include <gtest/gtest.h>

#include <cerrno>
#include <thread>

#include "testing/embed_service.h"
#include "testing/fault_env.h"

namespace ferry::embed::service {
namespace {

using namespace testing;
using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

TEST(EmbedClientFault, FailingSendmsgFailsTheRequestCleanly) {
  FaultEnv env;  // outlives the server's and the client's threads
  os::ScopedEnv scope(&env);
  const std::string path = TempSocketPath("client-fault");
  auto server = Server::Create(SmallServerOptions(path), SmallLayers());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fds_before = OpenFdCount();
  {
    auto c = Client::Create(SmallClientOptions(path, 0, 0, 1));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    StepData s = MakeStep(2, 40, 5);
    WriteInputs(**c, s);
    env.Fail(FaultEnv::kSendMsg, EPIPE);
    Status sent = (*c)->PrepareForward(2, 40, false);
    EXPECT_EQ(sent.code(), Code::kUnavailable) << sent.ToString();
    EXPECT_GE(env.calls(FaultEnv::kSendMsg), 1);
    Status waited = (*c)->Wait(0);
    EXPECT_EQ(waited.code(), Code::kUnavailable) << waited.ToString();
    env.Heal(FaultEnv::kSendMsg);
  }
  // The service drops the connection once the client is gone; nothing stays open.
  for (Deadline d = Deadline::After(std::chrono::seconds(5));
       OpenFdCount() != fds_before && !d.expired();)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(OpenFdCount(), fds_before);
  EXPECT_EQ((*server)->stats().steps_ok, 0u);
}

}  // namespace
}  // namespace ferry::embed::service
