#include "base/unix_socket.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/memory_file.h"
#include "testing/fault_env.h"

namespace ferry::os {
namespace {

using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

std::string TempSocket(const char* name) {
  return "/tmp/ferry-" + std::to_string(::getpid()) + "-" + name + ".sock";
}

Deadline Seconds(int s) { return Deadline::After(std::chrono::seconds(s)); }

struct Pair {
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a = UniqueFd(sv[0]);
    b = UniqueFd(sv[1]);
  }
  UniqueFd a, b;
};

// Accepts the next connection, waiting up to 5 s.
Result<UniqueFd> AcceptWithin5s(int listen_fd) {
  for (Deadline d = Seconds(5);;) {
    Result<UniqueFd> fd = AcceptUnix(listen_fd);
    if (fd.status().code() != Code::kInProgress || d.expired()) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(UnixSocket, PassesDescriptorsAndKeepsMessageBoundaries) {
  std::string path = TempSocket("fds");
  Result<UniqueFd> l = ListenUnix(UnixAddress::Path(path));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(AcceptUnix(l->get()).status().code(), Code::kInProgress);
  Result<UniqueFd> c = ConnectUnix(UnixAddress::Path(path), Seconds(5));
  ASSERT_TRUE(c.ok());
  Result<UniqueFd> s = AcceptWithin5s(l->get());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(PeerUid(s->get()).value(), ::getuid());

  auto file = CreateMemoryFile("test", 4096);
  ASSERT_TRUE(file.ok());
  int fds[] = {file->get()};
  ASSERT_TRUE(SendMessage(c->get(), "first", fds).ok());
  ASSERT_TRUE(SendMessage(c->get(), "second").ok());
  Result<Received> m = WaitMessage(s->get(), Seconds(5));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->bytes, "first");
  ASSERT_EQ(m->fds.size(), 1u);
  EXPECT_EQ(SealedFileSize(m->fds[0].get()).value(), 4096u);
  Result<Received> m2 = WaitMessage(s->get(), Seconds(5));
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->bytes, "second");
  EXPECT_TRUE(m2->fds.empty());

  // Nothing more: the deadline ends the wait; a closed peer is kUnavailable.
  EXPECT_EQ(WaitMessage(s->get(), Deadline::After(std::chrono::milliseconds(20))).status().code(),
            Code::kDeadlineExceeded);
  EXPECT_EQ(ReceiveMessage(s->get(), 100).status().code(), Code::kInProgress);
  c->reset();
  EXPECT_EQ(WaitMessage(s->get(), Seconds(5)).status().code(), Code::kUnavailable);
  ::unlink(path.c_str());
}

TEST(UnixSocket, AbstractAddressesLeaveNoFile) {
  const std::string name = "ferry-test-" + std::to_string(::getpid());
  Result<UniqueFd> l = ListenUnix(UnixAddress::Abstract(name));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Result<UniqueFd> c = ConnectUnix(UnixAddress::Abstract(name), Deadline());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(ListenUnix(UnixAddress::Abstract(name)).status().code(), Code::kUnavailable)
      << "in use";
  l->reset();
  EXPECT_EQ(ConnectUnix(UnixAddress::Abstract(name), Deadline::At(Clock::time_point::min()))
                .status()
                .code(),
            Code::kUnavailable);
  EXPECT_EQ(ListenUnix(UnixAddress::Abstract("")).status().code(), Code::kInvalidArgument);
}

TEST(UnixSocket, PathsAreProbedBeforeListening) {
  const std::string path = TempSocket("probe");
  EXPECT_EQ(ProbeSocketPath(path).value(), PathState::kFree);
  {
    Result<UniqueFd> l = ListenUnix(UnixAddress::Path(path));
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(ProbeSocketPath(path).value(), PathState::kLive);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << "a socket file is its owner's only";
    EXPECT_EQ(ListenUnix(UnixAddress::Path(path)).status().code(), Code::kAlreadyExists);
  }
  EXPECT_EQ(ProbeSocketPath(path).value(), PathState::kStale);
  EXPECT_TRUE(ListenUnix(UnixAddress::Path(path)).ok()) << "a stale socket is replaced";
  EXPECT_EQ(CheckListenPath("/tmp").code(), Code::kFailedPrecondition);
  EXPECT_EQ(CheckListenPath("/nonexistent-ferry-folder/x.sock").code(), Code::kNotFound);
  ::unlink(path.c_str());
}

TEST(UnixSocket, WakeDescriptorCancelsAWait) {
  Pair p;
  Result<UniqueFd> wake = MakeWakeFd();
  ASSERT_TRUE(wake.ok());
  SignalWakeFd(wake->get());
  EXPECT_EQ(WaitMessage(p.a.get(), Seconds(30), wake->get()).status().code(), Code::kCancelled);
}

TEST(UnixSocket, OversizedAndEmptyMessagesAreRejected) {
  Pair p;
  std::string big(kMaxMessageBytes + 100, 'x');
  ASSERT_EQ(::send(p.b.get(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  EXPECT_EQ(WaitMessage(p.a.get(), Seconds(5)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SendMessage(p.b.get(), big).code(), Code::kInvalidArgument);
  const int too_many[kMaxMessageFds + 1] = {};
  EXPECT_EQ(SendMessage(p.b.get(), "x", too_many).code(), Code::kInvalidArgument);
  ASSERT_EQ(::send(p.b.get(), "", 0, 0), 0);
  EXPECT_EQ(WaitMessage(p.a.get(), Seconds(5)).status().code(), Code::kInvalidArgument) << "empty";
}

TEST(UnixSocket, AFullSocketWaitsUntilTheDeadline) {
  Pair p;
  Status s;
  int sent = 0;
  while ((s = SendMessage(p.b.get(), "ack", {}, Deadline::After(Clock::duration::zero()))).ok())
    ++sent;
  EXPECT_GT(sent, 0);
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
  p.a.reset();
  EXPECT_EQ(SendMessage(p.b.get(), "ack").code(), Code::kUnavailable);
}

// ---- Faults injected through the OS seam ------------------------------------------------------

TEST(UnixSocketFault, FailingSendmsgIsUnavailableAndSendsNothing) {
  Pair p;
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(FaultEnv::kSendMsg, ENOBUFS);
  EXPECT_EQ(SendMessage(p.b.get(), "lost").code(), Code::kUnavailable);
  EXPECT_EQ(ReceiveMessage(p.a.get(), 100).status().code(), Code::kInProgress);
}

TEST(UnixSocketFault, ShortReadIsAMalformedMessageAndItsDescriptorsClose) {
  Pair p;
  auto file = CreateMemoryFile("cut", 4096);
  ASSERT_TRUE(file.ok());
  const int fds_before = OpenFdCount();
  int pass[] = {file->get()};
  ASSERT_TRUE(SendMessage(p.b.get(), "a longer message", pass).ok());
  FaultEnv env;
  ScopedEnv scope(&env);
  env.CutReceives(4);
  EXPECT_EQ(WaitMessage(p.a.get(), Seconds(5)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenFdCount(), fds_before) << "the passed descriptor was closed";
  ASSERT_TRUE(SendMessage(p.b.get(), "again").ok());
  Result<Received> r = ReceiveMessage(p.a.get(), 100);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->truncated);
  EXPECT_EQ(r->bytes, "agai");
}

TEST(UnixSocketFault, ClockJumpPastTheDeadlineEndsAWaitAtOnce) {
  Pair p;
  FaultEnv env;
  ScopedEnv scope(&env);
  const Deadline deadline = Seconds(30);
  env.JumpClock(std::chrono::hours(1));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitMessage(p.a.get(), deadline).status().code(), Code::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST(UnixSocketFault, FailingSocketCallsCloseWhatTheyOpened) {
  const std::string name = "ferry-fault-" + std::to_string(::getpid());
  const int fds_before = OpenFdCount();
  FaultEnv env;
  ScopedEnv scope(&env);
  env.Fail(FaultEnv::kSocket, EMFILE);
  EXPECT_EQ(ListenUnix(UnixAddress::Abstract(name)).status().code(), Code::kResourceExhausted);
  env.Heal(FaultEnv::kSocket);
  env.Fail(FaultEnv::kConnect, EPERM);
  EXPECT_EQ(ConnectUnix(UnixAddress::Abstract(name), Seconds(5)).status().code(),
            Code::kPermissionDenied);
  EXPECT_EQ(OpenFdCount(), fds_before);
}

}  // namespace
}  // namespace ferry::os
