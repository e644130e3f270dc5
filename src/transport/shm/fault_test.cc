// The shm transport under faults injected through the OS seam (base/os.h): two transports in
// this process; a failing mmap of the peer's region, a failing sendmsg on the connection.
// Each ends in a clean error and leaves no descriptor behind.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "base/shared_host.h"
#include "ferry/shared_memory.h"
#include "testing/fault_env.h"
#include "transport/transfer_state.h"
#include "transport/transport.h"

namespace ferry::internal {
Result<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;
using fault_testing::FaultEnv;
using fault_testing::OpenFdCount;

constexpr uint64_t kBytes = 1 << 16;

struct Side {
  std::string key;
  HostBuffer buf;
  std::shared_ptr<Region> region;
  std::unique_ptr<Transport> transport;
};

class ShmFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.default_deadline = 5s;
    inbox_ = std::make_shared<Inbox>(16, 1024);
    for (Side* s : {&a_, &b_}) {
      s->key = s == &a_ ? "a" : "b";
      auto buf = AllocateSharedHost(kBytes);
      ASSERT_TRUE(buf.ok()) << buf.status().ToString();
      s->buf = std::move(buf).value();
      auto t = MakeShmTransport(TransportContext{s->key, &options_, inbox_});
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      s->transport = std::move(t).value();
      s->region = std::make_shared<Region>();
      s->region->id = RegionId{1};
      s->region->base = s->buf.data();
      s->region->size = kBytes;
    }
    // b's buffer as two regions: the second is mapped by the peer only when a test asks.
    b_.region->size = kBytes / 2;
    second_ = std::make_shared<Region>();
    second_->id = RegionId{2};
    second_->base = b_.buf.data() + kBytes / 2;
    second_->size = kBytes / 2;
    remote_ = Describe(b_.region);
    remote2_ = Describe(second_);
    ASSERT_TRUE(a_.transport->Register(a_.region).ok());
    peer_.key = "b";
    peer_.host_id = LocalHostId();
    peer_.transports.push_back(b_.transport->Describe());
  }
  MemoryDesc Describe(const std::shared_ptr<Region>& r) {
    MemoryDesc d;
    d.engine_key = "b";
    d.region = r->id;
    d.address = reinterpret_cast<uint64_t>(r->base);
    d.size = r->size;
    d.kind = MemoryKind::kHost;
    d.host_id = LocalHostId();
    auto access = b_.transport->Register(r);
    EXPECT_TRUE(access.ok()) << access.status().ToString();
    if (access.ok()) d.access.push_back(*access);
    return d;
  }

  void TearDown() override {
    for (Side* s : {&a_, &b_}) {
      if (s->transport) {
        s->transport->Shutdown();
        if (s->region) (void)s->transport->Deregister(*s->region);
        if (s == &b_ && second_) (void)s->transport->Deregister(*second_);
      }
      s->transport.reset();
    }
  }

  Status Write(Channel& ch) {
    std::vector<TransferOp> ops = {{0, 0, kBytes / 2}};
    auto state =
        std::make_shared<TransferState>(TransferId{1}, kBytes / 2, ch.path(), Deadline::After(5s));
    Status s = ch.Post(Op::kWrite, ops, kBytes / 2, state);
    if (!s.ok()) state->Finish(s);
    state->PartDone(Status::Ok());  // the poster's own part, as the engine does
    return state->Wait(Deadline::After(5s));
  }

  // Declared first: outlives the transports, whose threads call through it.
  FaultEnv env_;
  os::ScopedEnv scope_{&env_};
  EngineOptions options_;
  std::shared_ptr<Inbox> inbox_;
  Side a_, b_;
  std::shared_ptr<Region> second_;
  MemoryDesc remote_, remote2_;
  EngineDesc peer_;
};

TEST_F(ShmFaultTest, FailingMmapOfThePeersRegionFailsTheChannelCleanly) {
  auto ep = a_.transport->Connect(peer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  // One region opened: the connection (and its notification ring) is up.
  ASSERT_TRUE((*ep)->OpenChannel(a_.region, remote_).ok());
  const int fds_before = OpenFdCount();
  env_.Fail(FaultEnv::kMmap, ENOMEM);
  auto ch = (*ep)->OpenChannel(a_.region, remote2_);
  EXPECT_EQ(ch.status().code(), Code::kResourceExhausted) << ch.status().ToString();
  EXPECT_GE(env_.calls(FaultEnv::kMmap), 1);
  EXPECT_EQ(OpenFdCount(), fds_before) << "the peer's memory file was closed";

  // The connection is fine: once mmap works again, the channel opens and moves the bytes.
  env_.Heal(FaultEnv::kMmap);
  std::memset(a_.buf.data(), 7, kBytes);
  ch = (*ep)->OpenChannel(a_.region, remote2_);
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  ASSERT_TRUE(Write(**ch).ok());
  EXPECT_EQ(std::to_integer<int>(b_.buf.data()[kBytes - 1]), 7);
  EXPECT_EQ(std::to_integer<int>(b_.buf.data()[0]), 0);
}

TEST_F(ShmFaultTest, FailingSendmsgFailsTheConnectionCleanly) {
  const int fds_before = OpenFdCount();
  {
    auto ep = a_.transport->Connect(peer_);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    env_.Fail(FaultEnv::kSendMsg, ENOBUFS);
    auto ch = (*ep)->OpenChannel(a_.region, remote_);
    EXPECT_EQ(ch.status().code(), Code::kUnavailable) << ch.status().ToString();
    EXPECT_FALSE((*ep)->healthy());
    env_.Heal(FaultEnv::kSendMsg);
  }
  // The failed connection is dropped with its socket; a new one works.
  for (Deadline d = Deadline::After(5s); OpenFdCount() != fds_before && !d.expired();)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(OpenFdCount(), fds_before);
  auto ep = a_.transport->Connect(peer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto ch = (*ep)->OpenChannel(a_.region, remote_);
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  EXPECT_TRUE(Write(**ch).ok());
}

}  // namespace
}  // namespace ferry::internal
