// The service against careless and hostile peers (issue 12): idle connections cost no thread
// and are bounded, threads that cannot start are errors, memory follows need and is freed,
// malformed, empty and over-capacity messages are answered, options and sockets are checked.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "embed/service/staging.h"
#include "embed/start_thread.h"
#include "ferry/embed_server.h"
#include "ferry/embed_stats.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

int ThreadCount() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// `n` connections to the service that send nothing; empty (and a test failure) when one fails.
std::vector<UniqueFd> ConnectIdle(const std::string& path, int n) {
  std::vector<UniqueFd> idle;
  for (int i = 0; i < n; ++i) {
    Result<UniqueFd> fd = ConnectTo(path);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (!fd.ok()) return {};
    idle.push_back(std::move(fd).value());
  }
  return idle;
}

// Issue 4: connections are served by the event loop; idle ones start no thread.
TEST(EmbedServiceHostile, IdleConnectionsStartNoThreads) {
  std::string path = TempSocketPath("idle");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  const int before = ThreadCount();
  std::vector<UniqueFd> idle = ConnectIdle(path, 80);
  ASSERT_EQ(idle.size(), 80u);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 80; }));
  EXPECT_EQ(ThreadCount(), before);
  auto c = MakeClient(path, 0, 0, 1);
  ASSERT_TRUE(c);
  Forward({c.get()}, MakeStep(4, 128, 1));
  idle.clear();
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 1; }));
}

// Issue 4: past max_connections a connection is answered kResourceExhausted and closed.
TEST(EmbedServiceHostile, ConnectionsPastTheLimitAreRefused) {
  std::string path = TempSocketPath("limit");
  ServerOptions o = SmallServerOptions(path);
  o.max_connections = 3;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> idle = ConnectIdle(path, 3);
  ASSERT_EQ(idle.size(), 3u);
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 3; }));
  auto refused = Client::Create(SmallClientOptions(path, 0, 0, 1));
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("at most 3 connections"), std::string_view::npos);
  Result<ServerStats> stats = QueryStats(path, false, std::chrono::seconds(5));
  EXPECT_EQ(stats.status().code(), Code::kResourceExhausted) << stats.status().ToString();
  idle.pop_back();
  ASSERT_TRUE(Eventually([&] { return server->memory().connections == 2; }));
  auto c = MakeClient(path, 0, 0, 1);
  ASSERT_TRUE(c);
  Forward({c.get()}, MakeStep(2, 32, 2));
}

// Issue 11: a thread that cannot start is kResourceExhausted (it used to be std::terminate).
TEST(EmbedServiceHostile, ThreadsThatCannotStartAreResourceExhausted) {
  std::string path = TempSocketPath("threads");
  FailThreadStartsForTesting(1);  // the event loop
  auto failed = Server::Create(SmallServerOptions(path), SmallLayers());
  EXPECT_EQ(failed.status().code(), Code::kResourceExhausted) << failed.status().ToString();
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // no socket left behind
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  FailThreadStartsForTesting(1);  // the group's worker (the client's reader starts later)
  auto refused = Client::Create(SmallClientOptions(path, 0, 0, 1));
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted) << refused.status().ToString();
  EXPECT_EQ(server->memory().groups, 0u);
  auto c = MakeClient(path, 0, 0, 1);
  ASSERT_TRUE(c);
  Forward({c.get()}, MakeStep(2, 32, 3));
}

// Issue 5: a host-mode group has no staging, whatever capacity it claims, and a group whose
// ranks left is removed. It used to zero-fill max_tokens x token_bytes (128 MiB here) for
// good.
TEST(EmbedServiceHostile, HostGroupsHoldNoStagingAndLeaveNothing) {
  std::string path = TempSocketPath("staging");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  const uint64_t rss = ResidentBytes();
  for (uint32_t dp = 0; dp < 2; ++dp) {
    ClientOptions o = SmallClientOptions(path, dp, 0, 1);
    o.max_tokens = kMaxTokens;
    auto c = Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    StepData empty;
    empty.qsl = {0, 0};
    empty.ctx = {1, 2};
    Forward({c->get()}, empty);
    Forward({c->get()}, MakeStep(4, 256, 4));
    EXPECT_EQ(server->memory().groups, 1u);
    EXPECT_EQ(server->memory().staging_bytes, 0u);
  }
  EXPECT_TRUE(Eventually([&] { return server->memory().groups == 0; }));
  EXPECT_LT(ResidentBytes(), rss + (64ull << 20));
}

// Issue 5: staging grows by need, in powers of two up to the limit, and is counted.
TEST(EmbedServiceHostile, StagingIsSizedByNeed) {
  std::atomic<uint64_t> held{0};
  {
    Staging s(&held);
    EXPECT_EQ(s.capacity(), 0u);
    ASSERT_TRUE(s.Reserve(1000, 1 << 20, false).ok());
    EXPECT_EQ(s.capacity(), 4096u);
    ASSERT_TRUE(s.Reserve(5000, 1 << 20, false).ok());
    EXPECT_EQ(s.capacity(), 8192u);
    ASSERT_TRUE(s.Reserve(3000, 1 << 20, false).ok());  // no shrink, no move
    EXPECT_EQ(s.capacity(), 8192u);
    ASSERT_TRUE(s.Reserve(600000, 700000, false).ok());  // capped at the limit
    EXPECT_EQ(s.capacity(), 700000u);
    EXPECT_EQ(held.load(), 700000u);
  }
  EXPECT_EQ(held.load(), 0u);
}

// Issue 18: an empty datagram is answered and its connection closed (it used to get nothing
// and stay open until the next client came).
TEST(EmbedServiceHostile, EmptyDatagramIsAnsweredAndClosed) {
  std::string path = TempSocketPath("empty");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  Result<UniqueFd> fd = ConnectTo(path);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::send(fd->get(), "", 0, MSG_NOSIGNAL), 0);
  Result<AnyMessage> d = NextMessage(fd->get(), std::chrono::seconds(2));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(std::holds_alternative<Registered>(*d));
  EXPECT_EQ(std::get<Registered>(*d).status.code(), Code::kInvalidArgument);
  EXPECT_EQ(Receive(fd->get(), Deadline::After(std::chrono::seconds(2))).status().code(),
            Code::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return server->memory().connections == 0; }));
  // From a registered rank 0: the step it meant fails, and the connection goes on.
  std::unique_ptr<RawRank> r = RegisterRaw(path, 2);
  ASSERT_TRUE(r);
  ASSERT_EQ(::send(r->fd.get(), "", 0, MSG_NOSIGNAL), 0);
  Reply reply = r->NextReply();
  EXPECT_EQ(reply.status.code(), Code::kInvalidArgument) << reply.status.ToString();
  EXPECT_EQ(LoadFlag(r->flag(0)), kFlagFailed);
}

// Issue 9: a request that does not decode is answered under its own seq when that much of it
// reads; one over the registered capacity fails under its seq with kOutOfRange, and the group
// goes on.
TEST(EmbedServiceHostile, BadRequestsFailUnderTheirSeq) {
  std::string path = TempSocketPath("seq");
  auto server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  std::unique_ptr<RawRank> r = RegisterRaw(path, 0);
  ASSERT_TRUE(r);
  ASSERT_TRUE(Send(r->fd.get(), Encode(Request{42, 1u << 21, 2, 0})).ok());  // past kMaxTokens
  Reply reply = r->NextReply();
  EXPECT_EQ(reply.seq, 42u);
  EXPECT_EQ(reply.status.code(), Code::kInvalidArgument) << reply.status.ToString();
  r->SetFlags(kFlagReset);
  std::string truncated = Encode(Request{43, 10, 1, 0});
  truncated.pop_back();
  ASSERT_TRUE(Send(r->fd.get(), truncated).ok());
  reply = r->NextReply();
  EXPECT_EQ(reply.seq, 43u);
  EXPECT_EQ(reply.status.code(), Code::kInvalidArgument);
  r->SetFlags(kFlagReset);
  for (Request over : {Request{44, 513, 1, 0}, Request{45, 65, 65, 0}}) {
    ASSERT_TRUE(Send(r->fd.get(), Encode(over)).ok());
    reply = r->NextReply();
    EXPECT_EQ(reply.seq, over.seq);
    EXPECT_EQ(reply.status.code(), Code::kOutOfRange) << reply.status.ToString();
    for (size_t slot = 0; slot < 3; ++slot) EXPECT_EQ(LoadFlag(r->flag(slot)), kFlagFailed);
    r->SetFlags(kFlagReset);
  }
  StepData s = MakeStep(4, 64, 5);
  r->Write(s);
  ASSERT_TRUE(Send(r->fd.get(), Encode(Request{46, 64, 4, 0})).ok());
  reply = r->NextReply();
  EXPECT_EQ(reply.seq, 46u);
  EXPECT_TRUE(reply.status.ok()) << reply.status.ToString();
  EXPECT_EQ(server->stats().steps_ok, 1u);
  EXPECT_EQ(server->stats().steps_failed, 4u);
}

// Issue 8: the socket path may hold nothing or a stale socket; a file that is not a socket and
// a live service's socket are refused and left alone.
TEST(EmbedServiceHostile, ListenReplacesOnlyStaleSockets) {
  std::string path = TempSocketPath("listen");
  {
    std::ofstream f(path);
    f << "not a socket";
  }
  auto on_file = Server::Create(SmallServerOptions(path), SmallLayers());
  EXPECT_EQ(on_file.status().code(), Code::kFailedPrecondition) << on_file.status().ToString();
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);  // still there
  ::unlink(path.c_str());
  {
    // A stale socket: bound, then closed without unlinking.
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  EXPECT_EQ(ProbeSocketPath(path).value(), PathState::kStale);
  auto first = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(first);
  EXPECT_EQ(ProbeSocketPath(path).value(), PathState::kLive);
  auto second = Server::Create(SmallServerOptions(path), SmallLayers());
  EXPECT_EQ(second.status().code(), Code::kAlreadyExists) << second.status().ToString();
  auto c = Client::Create(SmallClientOptions(path, 0, 0, 1));  // the first still serves
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Forward({c->get()}, MakeStep(2, 32, 6));
  EXPECT_EQ(CheckListenPath("/nonexistent-ferry-folder/x.sock").code(), Code::kNotFound);
  EXPECT_EQ(CheckListenPath("/tmp").code(), Code::kFailedPrecondition);
  EXPECT_EQ(CheckListenPath(path).code(), Code::kAlreadyExists);  // the first one accepts
}

// Issues 7, 11, 14 and "also seen": options no server runs with are refused before anything
// starts, naming the option.
TEST(EmbedServiceHostile, OptionsOutOfRangeAreInvalidArgument) {
  std::string path = TempSocketPath("options");
  auto refused = [&](auto edit) {
    ServerOptions o = SmallServerOptions(path);
    edit(o);
    return ValidateServerOptions(o).code();
  };
  EXPECT_EQ(refused([](ServerOptions&) {}), Code::kOk);
  EXPECT_EQ(refused([](ServerOptions& o) { o.wait_timeout = std::chrono::nanoseconds(0); }),
            Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.wait_timeout = std::chrono::seconds(-1); }),
            Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.wait_timeout = kMaxWaitTimeout + std::chrono::seconds(1); }),
            Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.policy.probes = -1; }), Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.policy.reprobe_every = -1; }),
            Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.gather.threads = 100000; }), Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.gather.chunk_tokens = int64_t{1} << 40; }),
            Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.max_connections = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(refused([](ServerOptions& o) { o.max_queued_steps = 0; }), Code::kInvalidArgument);
  ServerOptions o = SmallServerOptions(path);
  o.gather.threads = 100000;
  EXPECT_EQ(Server::Create(o, SmallLayers()).status().code(), Code::kInvalidArgument);
  // A layer index the protocol cannot name.
  std::vector<ServedLayer> layers = SmallLayers();
  Config c = SmallConfig(static_cast<int>(kMaxLayerIndex) + 1);
  layers.push_back(ServedLayer{Layout::Create(c).value(), layers[0].table});
  EXPECT_EQ(Server::Create(SmallServerOptions(path), layers).status().code(),
            Code::kInvalidArgument);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  // Client timeouts.
  ClientOptions co = SmallClientOptions(path, 0, 0, 1);
  co.step_timeout = std::chrono::nanoseconds(0);
  EXPECT_EQ(Client::Create(co).status().code(), Code::kInvalidArgument);
  co = SmallClientOptions(path, 0, 0, 1);
  co.connect_timeout = kMaxClientTimeout + std::chrono::seconds(1);
  EXPECT_EQ(Client::Create(co).status().code(), Code::kInvalidArgument);
  co = SmallClientOptions(path, 0, 0, 1);
  co.layers = {static_cast<uint32_t>(kMaxLayerIndex) + 1};
  EXPECT_EQ(Client::Create(co).status().code(), Code::kInvalidArgument);
}

// Issue 7: a synthetic table larger than the memory available is refused before it is built.
TEST(EmbedServiceHostile, SyntheticTableLargerThanMemoryIsRefused) {
  std::vector<uint32_t> ids = {0, 1};
  Result<std::vector<ServedLayer>> big =
      MakeServedLayers(SmallConfig(0), ids, Dtype::kBf16, {}, 1u << 20, nullptr, nullptr,
                       /*memory_limit=*/1 << 20);  // 1 Mi rows of 32 bytes in 1 MiB
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted) << big.status().ToString();
  EXPECT_NE(big.status().message().find("needs 32.0 MiB, more than the 1.0 MiB"), std::string_view::npos)
      << big.status().ToString();
  EXPECT_TRUE(MakeServedLayers(SmallConfig(0), ids, Dtype::kBf16, {}, 0, nullptr, nullptr,
                               /*memory_limit=*/1 << 20)
                  .ok());
  EXPECT_GT(AvailableMemoryBytes(), 0u);
}

}  // namespace
}  // namespace ferry::embed::service
