// The service in a child process: killed in the middle of a step, every client wait ends
// with the connection error within the deadline; a client process killed in the middle of a
// step loses its registration and the service goes on serving the other data-parallel rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

// Runs the service in a child until it is killed. Call before this process starts threads.
pid_t StartServiceProcess(const std::string& path) {
  pid_t pid = ::fork();
  if (pid == 0) {
    auto server = Server::Create(SmallServerOptions(path), SmallLayers());
    if (!server.ok()) ::_exit(3);
    for (;;) ::pause();
  }
  return pid;
}

void Kill(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

Status ForwardAll(std::vector<Client*> ranks, const StepData& s) {
  WriteInputs(*ranks[0], s);
  FERRY_RETURN_IF_ERROR(ranks[0]->PrepareForward(s.qsl.size() - 1, s.tokens.size(), false));
  for (Client* c : ranks)
    for (size_t slot = 0; slot < c->slots(); ++slot) {
      FERRY_RETURN_IF_ERROR(c->Wait(slot));
      ExpectRows(*c, slot, s);
    }
  for (Client* c : ranks) FERRY_RETURN_IF_ERROR(c->ReleaseOutputs());
  return Status::Ok();
}

TEST(EmbedServiceProcess, KilledServiceFailsEveryWaitWithinTheDeadline) {
  std::string path = TempSocketPath("killed-service");
  pid_t service = StartServiceProcess(path);
  ASSERT_GT(service, 0);
  auto r0 = Client::Create(SmallClientOptions(path, 0, 0, 2));
  auto r1 = Client::Create(SmallClientOptions(path, 0, 1, 2));
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status().ToString() << r1.status().ToString();
  Client& a = **r0;
  Client& b = **r1;
  ASSERT_TRUE(ForwardAll({&a, &b}, MakeStep(4, 512, 1)).ok());
  // Rank 1 holds its outputs, so the next step is in flight at its first layer when the
  // service dies.
  ASSERT_TRUE(b.PrepareForward(1, 1, true).ok());
  StepData s = MakeStep(64, 64, 2);
  WriteInputs(a, s);
  ASSERT_TRUE(a.PrepareForward(64, 64, false).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  Kill(service);
  for (size_t slot = 0; slot < a.slots(); ++slot) {
    Status w = a.Wait(slot);
    EXPECT_EQ(w.code(), Code::kUnavailable) << w.ToString();
    EXPECT_NE(w.message().find("connection lost"), std::string_view::npos) << w.ToString();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (size_t slot = 0; slot < b.slots(); ++slot) {
    EXPECT_EQ(a.flag(slot), kFlagFailed);
    EXPECT_EQ(b.flag(slot), kFlagFailed);
    EXPECT_EQ(b.Wait(slot).code(), Code::kUnavailable);
  }
  EXPECT_EQ(a.PrepareForward(1, 1, false).code(), Code::kUnavailable);
  EXPECT_EQ(b.ReleaseOutputs().code(), Code::kUnavailable);
  EXPECT_EQ(b.flag(0), kFlagFailed);  // a release after the loss keeps the flags failed
}

TEST(EmbedServiceProcess, KilledClientIsForgottenAndOthersAreServed) {
  std::string path = TempSocketPath("killed-client");
  pid_t service = StartServiceProcess(path);
  ASSERT_GT(service, 0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t client = ::fork();
  if (client == 0) {
    // Data-parallel rank 1 (two tensor-parallel ranks): one good step, then a step that its
    // rank 1 never releases the outputs for, then it dies.
    auto c0 = Client::Create(SmallClientOptions(path, 1, 0, 2));
    auto c1 = Client::Create(SmallClientOptions(path, 1, 1, 2));
    if (!c0.ok() || !c1.ok() || !ForwardAll({c0->get(), c1->get()}, MakeStep(4, 128, 3)).ok())
      ::_exit(4);
    if (!(*c1)->PrepareForward(1, 1, true).ok()) ::_exit(5);
    StepData s = MakeStep(4, 128, 4);
    WriteInputs(**c0, s);
    if (!(*c0)->PrepareForward(4, 128, false).ok()) ::_exit(6);
    char x = 'r';
    if (::write(ready[1], &x, 1) != 1) ::_exit(7);
    for (;;) ::pause();
  }
  ::close(ready[1]);  // a child that exits early ends the read below
  ready[1] = -1;
  char x = 0;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  auto r0 = Client::Create(SmallClientOptions(path, 0, 0, 1));
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  ASSERT_TRUE(ForwardAll({r0->get()}, MakeStep(4, 512, 5)).ok());
  Kill(client);
  ASSERT_TRUE(ForwardAll({r0->get()}, MakeStep(64, 64, 6)).ok());
  // The dead client's registration is gone: its rank registers again and is served.
  Result<std::unique_ptr<Client>> again = Status(Code::kUnknown, "");
  for (int i = 0; i < 200; ++i) {
    // A group of one now: refused (kAlreadyExists, or kInvalidArgument for the other tp_size)
    // until both dead ranks are dropped.
    again = Client::Create(SmallClientOptions(path, 1, 0, 1));
    if (again.ok() || (again.status().code() != Code::kAlreadyExists &&
                       again.status().code() != Code::kInvalidArgument))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Status st = ForwardAll({again->get()}, MakeStep(8, 256, 7));
  EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(ForwardAll({r0->get()}, MakeStep(2, 8, 8)).ok());
  r0->reset();
  again->reset();
  Kill(service);
  ::close(ready[0]);
}

}  // namespace
}  // namespace ferry::embed::service
