// The embedding service's bounds against a peer on its socket (docs/limits.md lists them):
// datagrams over os::kMaxMessageBytes, descriptors over os::kMaxMessageFds, a client that asks
// for stats and never reads the answers, and a churn of connections. Each is refused or dropped
// with the documented error, starts no thread, leaks no descriptor, keeps resident memory
// bounded, and a good client is served afterwards; each case takes a second or two.
//
// Shown elsewhere and not repeated: max_connections (service_hostile_test.cc,
// ConnectionsPastTheLimitAreRefused), idle connections start no thread (IdleConnectionsStartNoThreads),
// max_queued_steps (service_test.cc, StepsPastTheQueueLimitFailWithResourceExhausted), requests
// over the registered capacity (BadRequestsFailUnderTheirSeq), staging sized by need
// (StagingIsSizedByNeed), the decoder's field bounds (protocol_test.cc and fuzz/).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "ferry/embed_server.h"
#include "testing/embed_service.h"
#include "testing/other_user.h"
#include "testing/resources.h"

namespace ferry::embed::service {
namespace {

using namespace testing;  // NOLINT: test helpers
using ferry::testing::Eventually;
using ferry::testing::ResidentBytes;
using ferry::testing::ThreadCount;

// Resident memory a flood may add (allocator caches): far below one buffer of a claimed size
// per message.
constexpr uint64_t kRssSlack = (uint64_t{32} << 20) + ferry::testing::kSanitizerRssSlack;

// Open descriptors of this process (the service runs in it: a descriptor it leaks shows here).
int OpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n - 1;  // the directory's own
}

// This process's threads once the service's groups are gone and their workers (and the last
// client's threads) have ended: the count no longer changes over 100 ms.
int SettledThreads(Server& server) {
  EXPECT_TRUE(Eventually([&] { return server.memory().groups == 0; }));
  int last = ThreadCount();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int now = ThreadCount();
    if (now == last) return now;
    last = now;
  }
  return last;
}

void ExpectServesAClient(const std::string& path, uint32_t seed) {
  auto c = MakeClient(path, 0, 0, 1);
  ASSERT_TRUE(c);
  Forward({c.get()}, MakeStep(4, 64, seed));
}

// A datagram larger than os::kMaxMessageBytes is consumed, not buffered at its size: from a new
// connection it is answered kInvalidArgument and the connection closed, from a registered rank
// it fails that step only. Threads and memory stay as they were.
TEST(EmbedServiceLimits, DatagramsOverTheMessageLimitAreRefused) {
  std::string path = TempSocketPath("limits-big");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  ExpectServesAClient(path, 1);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  const int threads = SettledThreads(*server);
  const uint64_t rss = ResidentBytes();
  const std::string big(2 * kMaxMessageBytes, 'z');
  for (int i = 0; i < 20; ++i) {
    Result<UniqueFd> fd = ConnectTo(path);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    ASSERT_EQ(::send(fd->get(), big.data(), big.size(), MSG_NOSIGNAL), static_cast<ssize_t>(big.size()));
    Result<AnyMessage> d = NextMessage(fd->get(), std::chrono::seconds(2));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE(std::holds_alternative<Registered>(*d));
    EXPECT_EQ(std::get<Registered>(*d).status.code(), Code::kInvalidArgument) << std::get<Registered>(*d).status.ToString();
    EXPECT_EQ(Receive(fd->get(), Deadline::After(std::chrono::seconds(2))).status().code(), Code::kUnavailable);
  }
  std::unique_ptr<RawRank> r = RegisterRaw(path, 1);
  ASSERT_TRUE(r);
  ASSERT_EQ(::send(r->fd.get(), big.data(), big.size(), MSG_NOSIGNAL), static_cast<ssize_t>(big.size()));
  Reply reply = r->NextReply();
  EXPECT_EQ(reply.status.code(), Code::kInvalidArgument) << reply.status.ToString();
  r.reset();
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  // The rank's group worker ends once its rank left (reaped by the event loop).
  EXPECT_TRUE(Eventually([&] { return ThreadCount() == threads; })) << ThreadCount() << " threads, " << threads << " before";
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
  ExpectServesAClient(path, 2);
}

// Descriptors past os::kMaxMessageFds (a registration brings two) are closed, none kept: the
// message is refused and this process holds as many descriptors after as before.
TEST(EmbedServiceLimits, DescriptorsOverTheLimitAreClosed) {
  std::string path = TempSocketPath("limits-fds");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  ExpectServesAClient(path, 3);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  for (size_t i = 0; i < 2 * kMaxMessageFds; ++i) {
    files.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(files.back().valid());
    raw.push_back(files.back().get());
  }
  const int fds = OpenFds();
  const int threads = SettledThreads(*server);
  std::string reg = Encode(SmallRegister(0, 0, 1));
  for (int i = 0; i < 10; ++i) {
    Result<UniqueFd> fd = ConnectTo(path);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    // Sent by hand: os::SendMessage refuses more than kMaxMessageFds itself.
    msghdr m = {};
    iovec iov = {reg.data(), reg.size()};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2 * kMaxMessageFds)] = {};
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * raw.size());
    std::memcpy(CMSG_DATA(c), raw.data(), sizeof(int) * raw.size());
    ASSERT_EQ(::sendmsg(fd->get(), &m, MSG_NOSIGNAL), static_cast<ssize_t>(reg.size())) << errno;
    Result<AnyMessage> d = NextMessage(fd->get(), std::chrono::seconds(2));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE(std::holds_alternative<Registered>(*d));
    EXPECT_EQ(std::get<Registered>(*d).status.code(), Code::kInvalidArgument) << std::get<Registered>(*d).status.ToString();
  }
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 0 && server->memory().groups == 0; }));
  EXPECT_TRUE(Eventually([&] { return OpenFds() == fds; })) << OpenFds() << " descriptors open, " << fds << " before";
  EXPECT_EQ(ThreadCount(), threads);
  ExpectServesAClient(path, 4);
}

// A monitoring connection that asks for stats without end and reads none of the answers does
// not make the service queue them: its first send that would wait drops the connection
// (server_internal.h, Connection::Send), and the service goes on serving.
TEST(EmbedServiceLimits, AStatsFloodFromAPeerThatDoesNotReadIsDropped) {
  std::string path = TempSocketPath("limits-stats");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  ExpectServesAClient(path, 5);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  const int threads = SettledThreads(*server);
  const uint64_t rss = ResidentBytes();
  Result<UniqueFd> fd = ConnectTo(path);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  const std::string ask = Encode(StatsRequest{false});
  int sent = 0;
  bool dropped = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!dropped && std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::send(fd->get(), ask.data(), ask.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(ask.size())) {
      ++sent;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      dropped = true;  // EPIPE / ECONNRESET: the service shut the connection down
    }
  }
  EXPECT_TRUE(dropped) << sent << " requests sent and the connection still open";
  EXPECT_GT(sent, 10);
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  EXPECT_EQ(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
  ExpectServesAClient(path, 6);
}

// Connections that come and go by the thousand leave no thread, descriptor or connection behind.
TEST(EmbedServiceLimits, ConnectionChurnLeavesNothing) {
  std::string path = TempSocketPath("limits-churn");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  ExpectServesAClient(path, 7);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  const int threads = SettledThreads(*server);
  const int fds = OpenFds();
  const uint64_t rss = ResidentBytes();
  for (int round = 0; round < 20; ++round) {
    std::vector<UniqueFd> batch;
    for (int i = 0; i < 50; ++i) {
      Result<UniqueFd> fd = ConnectTo(path);
      ASSERT_TRUE(fd.ok()) << fd.status().ToString();
      batch.push_back(std::move(fd).value());
    }
    EXPECT_EQ(ThreadCount(), threads);
  }
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  EXPECT_TRUE(Eventually([&] { return OpenFds() == fds; })) << OpenFds() << " descriptors open, " << fds << " before";
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
  ExpectServesAClient(path, 8);
}

// Another user's process is refused at accept unless ServerOptions::allowed_uids names it
// (SO_PEERCRED); the socket file is then open to others, and the check is what keeps them out.
TEST(EmbedServiceLimits, AnotherUsersProcessIsRefusedUnlessAllowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  using ferry::testing::ConnectAsUser;
  using ferry::testing::kNobody;
  // Allowed users, and what nobody's connection gets: 0 closed at accept, 1 served, 2 refused
  // by the socket file's mode (0600 when no other user is allowed).
  const std::vector<std::pair<std::vector<uint32_t>, std::vector<int>>> cases = {
      {{}, {0, 2}}, {{1234}, {0}}, {{1234, kNobody}, {1}}};
  int n = 0;
  for (const auto& [allowed, want] : cases) {
    SCOPED_TRACE(n);
    std::string path = TempSocketPath("limits-uid-" + std::to_string(n++));
    ServerOptions o = SmallServerOptions(path);
    o.allowed_uids = allowed;
    auto server = StartServer(o);
    ASSERT_TRUE(server);
    const int got = ConnectAsUser(kNobody, path, false, want[0] == 1 ? 300 : 3000);
    EXPECT_NE(std::find(want.begin(), want.end(), got), want.end()) << got;
    ExpectServesAClient(path, 9);
  }
}

}  // namespace
}  // namespace ferry::embed::service
