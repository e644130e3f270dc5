// Deregistering a region that a transfer still uses (one waiting on a stopped peer, here a
// channel that holds the region until the test lets go): the call fails with
// kDeadlineExceeded and the region stays known, retiring, so that a retry once the transfer
// ended frees it. The transport is `local` behind that holding channel.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "engine/engine_core.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;

// What the holding channel keeps: the transfer's part and its use of the local region.
struct Hold {
  std::shared_ptr<TransferState> state;
  std::shared_ptr<RegionUse> use;
};
std::mutex g_mu;
std::vector<Hold> g_holds;  // GUARDED_BY(g_mu)

void LetGo() {
  std::vector<Hold> holds;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    holds.swap(g_holds);
  }
  for (auto& h : holds) h.state->PartDone(Status::Ok());
}

// Posts nothing: takes a part of the transfer and the local region, as a transfer to a peer
// that does not answer does, until LetGo().
class HoldingChannel final : public Channel {
 public:
  HoldingChannel(std::unique_ptr<Channel> inner, std::shared_ptr<Region> local)
      : inner_(std::move(inner)), local_(std::move(local)) {}
  Status Post(Op, std::span<const TransferOp>, uint64_t, const std::shared_ptr<TransferState>& state) override {
    auto use = RegionUse::Make(local_);
    if (!use) return Status(Code::kFailedPrecondition, "local region was deregistered");
    state->AddParts(1);
    std::lock_guard<std::mutex> lock(g_mu);
    g_holds.push_back({state, std::move(use)});
    return Status::Ok();
  }
  TransferPath path() const override { return inner_->path(); }

 private:
  std::unique_ptr<Channel> inner_;
  std::shared_ptr<Region> local_;
};

class HoldingEndpoint final : public Endpoint {
 public:
  explicit HoldingEndpoint(std::shared_ptr<Endpoint> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    FERRY_ASSIGN_OR_RETURN(auto ch, inner_->OpenChannel(local, remote));
    return std::unique_ptr<Channel>(new HoldingChannel(std::move(ch), local));
  }
  Status Notify(std::string_view m) override { return inner_->Notify(m); }

 private:
  std::shared_ptr<Endpoint> inner_;
};

class HoldingTransport final : public WrappedTransport {
 public:
  using WrappedTransport::WrappedTransport;

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override {
    return std::make_shared<HoldingEndpoint>(std::move(ep));
  }
};

Result<std::unique_ptr<Transport>> MakeHolding(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new HoldingTransport(std::move(inner)));
}

TEST(Deregister, ARegionStillInUseStaysRetiringAndARetryFreesIt) {
  const TransportEntry entries[] = {{"local", &MakeHolding}};
  EngineOptions options;
  options.key = "dereg";
  options.deregister_timeout = 200ms;
  auto e = EngineCore::Create(options, entries);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(4096), other(4096);
  auto d = (*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1);
  auto o = (*e)->RegisterMemory(other.data(), other.size(), MemoryKind::kHost, -1);
  ASSERT_TRUE(d.ok() && o.ok());
  auto s = (*e)->OpenSession(*d, *o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TransferOptions t_options;
  t_options.deadline = 50ms;
  Transfer t = (*s)->Post(Op::kWrite, std::vector<TransferOp>{{0, 0, 64}}, t_options);
  EXPECT_EQ(t.Wait().code(), Code::kDeadlineExceeded);  // the transfer ended; its part did not

  auto start = Clock::now();
  Status first = (*e)->DeregisterMemory(d->region);
  EXPECT_EQ(first.code(), Code::kDeadlineExceeded) << first.ToString();
  EXPECT_GE(Clock::now() - start, 150ms);
  // Retiring: still known, but no new session or transfer reaches it.
  EXPECT_EQ((*e)->OpenSession(*d, *o).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ((*s)->Post(Op::kWrite, std::vector<TransferOp>{{0, 0, 64}}, {}).Wait().code(),
            Code::kFailedPrecondition);
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kDeadlineExceeded);

  LetGo();  // the peer answered
  EXPECT_TRUE((*e)->DeregisterMemory(d->region).ok());
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kNotFound);  // freed, once
  EXPECT_TRUE((*e)->DeregisterMemory(o->region).ok());
  (*e)->Shutdown();
}

TEST(Deregister, ShutdownFreesARetiringRegion) {
  const TransportEntry entries[] = {{"local", &MakeHolding}};
  EngineOptions options;
  options.key = "dereg-shutdown";
  options.deregister_timeout = 100ms;
  auto e = EngineCore::Create(options, entries);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(4096);
  auto d = (*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1);
  ASSERT_TRUE(d.ok());
  auto s = (*e)->OpenSession(*d, *d);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Transfer t = (*s)->Post(Op::kWrite, std::vector<TransferOp>{{0, 64, 64}}, {});
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kDeadlineExceeded);
  LetGo();
  EXPECT_TRUE(t.Wait().ok());
  (*e)->Shutdown();
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kNotFound);
}

TEST(Deregister, ANonPositiveTimeoutIsRefused) {
  EngineOptions options;
  options.deregister_timeout = Duration::zero();
  EXPECT_EQ(Engine::Create(options).status().code(), Code::kInvalidArgument);
}

// A transport whose peer process still holds the region when its wait ends (as cuda_ipc's lease
// table reports a peer copying into GPU memory): Deregister says so, `refusals` times.
class RevokingTransport final : public WrappedTransport {
 public:
  RevokingTransport(std::unique_ptr<Transport> inner, int refusals)
      : WrappedTransport(std::move(inner)), refusals_(refusals) {}
  Status Deregister(const Region& r) override {
    ++calls;
    if (refusals_ > 0) {
      --refusals_;
      return Status(Code::kDeadlineExceeded, "a peer process still copies into the region");
    }
    return WrappedTransport::Deregister(r);
  }
  static inline std::atomic<int> calls{0};

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override { return ep; }

 private:
  int refusals_;
};

Result<std::unique_ptr<Transport>> MakeRevoking(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new RevokingTransport(std::move(inner), 2));
}

TEST(Deregister, ARegionAPeerProcessStillHoldsStaysRetiringUntilItLetsGo) {
  const TransportEntry entries[] = {{"local", &MakeRevoking}};
  EngineOptions options;
  options.key = "dereg-revoke";
  auto e = EngineCore::Create(options, entries);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(4096);
  auto d = (*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1);
  ASSERT_TRUE(d.ok());
  RevokingTransport::calls = 0;
  Status first = (*e)->DeregisterMemory(d->region);
  EXPECT_EQ(first.code(), Code::kDeadlineExceeded) << first.ToString();
  EXPECT_NE(first.message().find("still copies"), std::string_view::npos) << first.ToString();
  EXPECT_EQ((*e)->OpenSession(*d, *d).status().code(), Code::kFailedPrecondition);  // retiring
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kDeadlineExceeded);    // asked again
  EXPECT_TRUE((*e)->DeregisterMemory(d->region).ok());                              // it let go
  EXPECT_EQ(RevokingTransport::calls.load(), 3);
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kNotFound);
  (*e)->Shutdown();
}

}  // namespace
}  // namespace ferry::internal
