// Deregistering a region that a transfer still uses (one waiting on a stopped peer, here an
// interposer that holds the region until the test lets go): the call fails with
// kDeadlineExceeded and the region stays known, retiring, so that a retry once the transfer
// ended frees it. The transport is `local` behind that interposer
// (testing/wrapped_transport.h).
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <string>

#include "base/mutex.h"
#include "engine/engine_core.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

// What the holding interposer keeps: the transfer's part and its use of the local region.
struct Hold {
  std::shared_ptr<TransferState> state;
  std::shared_ptr<RegionUse> use;
};
Mutex g_mu;
std::vector<Hold> g_holds GUARDED_BY(g_mu);

void LetGo() {
  std::vector<Hold> holds;
  {
    MutexLock lock(&g_mu);
    holds.swap(g_holds);
  }
  for (auto& h : holds) h.state->PartDone(Status::Ok());
}

// Posts nothing: takes a part of the transfer and the local region, as a transfer to a peer
// that does not answer does, until LetGo().
class HoldRegions final : public Interposer {
 public:
  Status Post(Channel&, const std::shared_ptr<Region>& local, Op, std::span<const TransferOp>, uint64_t,
              const std::shared_ptr<TransferState>& state) override {
    auto use = RegionUse::Make(local);
    if (!use) return Status(Code::kFailedPrecondition, "local region was deregistered");
    state->AddParts(1);
    MutexLock lock(&g_mu);
    g_holds.push_back({state, std::move(use)});
    return Status::Ok();
  }
};

// An engine over `local` behind the interposer that `make` puts there.
Result<std::shared_ptr<EngineCore>> MakeEngine(TransportFactory make, std::string key,
                                               std::optional<Duration> deregister_timeout = std::nullopt) {
  const TransportEntry entries[] = {{"local", make}};
  EngineOptions options;
  options.key = std::move(key);
  if (deregister_timeout) options.deregister_timeout = *deregister_timeout;
  return EngineCore::Create(options, entries);
}

TEST(Deregister, ARegionStillInUseStaysRetiringAndARetryFreesIt) {
  auto e = MakeEngine(&MakeInterposedLocal<HoldRegions>, "dereg", 200ms);
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
  auto e = MakeEngine(&MakeInterposedLocal<HoldRegions>, "dereg-shutdown", 100ms);
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
// table reports a peer copying into GPU memory): Deregister says so, twice.
class Revoking final : public Interposer {
 public:
  Status Deregister(Transport& inner, const Region& r) override {
    ++calls;
    if (refusals_ > 0) {
      --refusals_;
      return Status(Code::kDeadlineExceeded, "a peer process still copies into the region");
    }
    return inner.Deregister(r);
  }
  static inline std::atomic<int> calls{0};

 private:
  int refusals_ = 2;
};

TEST(Deregister, ARegionAPeerProcessStillHoldsStaysRetiringUntilItLetsGo) {
  auto e = MakeEngine(&MakeInterposedLocal<Revoking>, "dereg-revoke");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(4096);
  auto d = (*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1);
  ASSERT_TRUE(d.ok());
  Revoking::calls = 0;
  Status first = (*e)->DeregisterMemory(d->region);
  EXPECT_EQ(first.code(), Code::kDeadlineExceeded) << first.ToString();
  EXPECT_NE(first.message().find("still copies"), std::string_view::npos) << first.ToString();
  EXPECT_EQ((*e)->OpenSession(*d, *d).status().code(), Code::kFailedPrecondition);  // retiring
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kDeadlineExceeded);    // asked again
  EXPECT_TRUE((*e)->DeregisterMemory(d->region).ok());                              // it let go
  EXPECT_EQ(Revoking::calls.load(), 3);
  EXPECT_EQ((*e)->DeregisterMemory(d->region).code(), Code::kNotFound);
  (*e)->Shutdown();
}

}  // namespace
}  // namespace ferry::internal
