#include <gtest/gtest.h>

#include "ferry/engine.h"
#include "ferry/system.h"
#include "testing/bytes.h"

namespace ferry {
namespace {

std::unique_ptr<Engine> Make(std::string key = "") {
  EngineOptions options;
  options.key = std::move(key);
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(Engine, CreateValidatesOptions) {
  EngineOptions options;
  options.transports = {"no-such-transport"};
  EXPECT_EQ(Engine::Create(options).status().code(), Code::kUnavailable);
  options = {};
  options.default_deadline = Duration::zero();
  EXPECT_EQ(Engine::Create(options).status().code(), Code::kInvalidArgument);
  options = {};
  options.key = std::string(kMaxKeyBytes + 1, 'k');
  EXPECT_EQ(Engine::Create(options).status().code(), Code::kInvalidArgument);
}

TEST(Engine, CreateRejectsCountsAndTimesOutOfRange) {
  auto code = [](auto change, std::vector<std::string> transports = {}) {
    EngineOptions o;
    o.transports = std::move(transports);
    change(o);
    return Engine::Create(o).status().code();
  };
  for (int threads : {-1, kMaxCopyThreads + 1, 100000}) {
    SCOPED_TRACE(threads);
    EXPECT_EQ(code([&](EngineOptions& o) { o.copy_threads = threads; }), Code::kInvalidArgument);
    EXPECT_EQ(code([&](EngineOptions& o) { o.copy_threads = threads; }, {"local"}), Code::kInvalidArgument);
  }
  EXPECT_EQ(code([](EngineOptions& o) { o.max_pending_notifications = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.max_pending_notifications = kMaxPendingNotifications + 1; }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.max_notification_bytes = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.max_notification_bytes = o.max_pending_notification_bytes + 1; }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.max_pending_notification_bytes = kMaxPendingNotificationBytes + 1; }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.default_deadline = Duration(-1); }), Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.wait_spin = Duration(-1); }), Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.wait_spin = std::chrono::seconds(1) + Duration(1); }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.shm.revoke_timeout = std::chrono::milliseconds(0); }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.shm.call_timeout = std::chrono::milliseconds(-5); }),
            Code::kInvalidArgument);
  EXPECT_EQ(code([](EngineOptions& o) { o.shm.call_timeout = std::chrono::hours(25); }), Code::kInvalidArgument);
  // The bounds themselves, and the defaults, are fine.
  EXPECT_TRUE(Engine::Create(EngineOptions{}).ok());
  EXPECT_EQ(code([](EngineOptions& o) {
              o.copy_threads = 16;
              o.wait_spin = std::chrono::seconds(1);
              o.max_pending_notifications = 1;
              o.max_notification_bytes = 1;
              o.max_pending_notification_bytes = 1;
            }, {"local"}),
            Code::kOk);
}

TEST(Engine, TheNotificationBacklogIsBoundedByBytes) {
  EXPECT_EQ(EngineOptions{}.max_pending_notification_bytes, size_t{64} << 20);
  EngineOptions o;
  o.transports = {"local"};
  o.max_notification_bytes = 64 << 10;
  o.max_pending_notification_bytes = 1 << 20;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::string big(64 << 10, 'n');
  for (int i = 0; i < 16; ++i) ASSERT_TRUE((*e)->Notify((*e)->key(), big).ok()) << i;
  Status full = (*e)->Notify((*e)->key(), big);
  EXPECT_EQ(full.code(), Code::kResourceExhausted) << full.ToString();
  EXPECT_EQ((*e)->Notify((*e)->key(), "x").code(), Code::kResourceExhausted);  // not one byte more
  EXPECT_EQ((*e)->stats().dropped_notifications, 2u);
  EXPECT_EQ((*e)->PopNotifications().size(), 16u);
  EXPECT_TRUE((*e)->Notify((*e)->key(), big).ok());  // taking them frees the room
}

TEST(Engine, DescribeRoundTripsAndNamesTransports) {
  auto e = Make();
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->key().empty());
  EngineDesc d = e->Describe();
  EXPECT_EQ(d.key, e->key());
  EXPECT_EQ(d.host_id, LocalHostId());
  EXPECT_EQ(d.pid, static_cast<uint32_t>(getpid()));
  EXPECT_NE(d.FindTransport("local"), nullptr);
  EXPECT_EQ(*EngineDesc::Unpack(d.Pack()), d);
  auto names = e->transports();
  EXPECT_NE(std::find(names.begin(), names.end(), "local"), names.end());
  // Two engines get distinct default keys.
  auto f = Make();
  EXPECT_NE(e->key(), f->key());
}

TEST(Engine, RegisterRejectsBadInput) {
  auto e = Make();
  ASSERT_TRUE(e);
  std::vector<uint8_t> buf(64);
  EXPECT_EQ(e->RegisterMemory(nullptr, 64).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(e->RegisterMemory(buf.data(), 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(e->RegisterMemory(buf.data(), 64, MemoryKind::kHost, 0).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(e->RegisterMemory(reinterpret_cast<void*>(UINTPTR_MAX - 8), 64).status().code(),
            Code::kInvalidArgument);
  std::string reason;
  if (!CudaAvailable(&reason)) {
    EXPECT_EQ(e->RegisterMemory(buf.data(), 64, MemoryKind::kCuda, 0).status().code(),
              Code::kFailedPrecondition);
  } else {
    // Host memory is not device memory.
    EXPECT_EQ(e->RegisterMemory(buf.data(), 64, MemoryKind::kCuda, 0).status().code(),
              Code::kInvalidArgument);
  }
  EXPECT_EQ(e->DeregisterMemory(static_cast<RegionId>(12345)).code(), Code::kNotFound);
}

TEST(Engine, RegisteredDescriptorDescribesTheRegion) {
  auto e = Make("reg");
  ASSERT_TRUE(e);
  std::vector<uint8_t> buf(1000);
  auto d = e->RegisterMemory(buf.data(), buf.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->engine_key, "reg");
  EXPECT_EQ(d->address, reinterpret_cast<uint64_t>(buf.data()));
  EXPECT_EQ(d->size, 1000u);
  EXPECT_EQ(d->kind, MemoryKind::kHost);
  EXPECT_EQ(d->device, -1);
  EXPECT_NE(d->FindAccess("local"), nullptr);
  auto d2 = e->RegisterMemory(buf.data(), 10);
  ASSERT_TRUE(d2.ok());
  EXPECT_NE(d->region, d2->region);
  EXPECT_TRUE(e->DeregisterMemory(*d).ok());
  EXPECT_TRUE(e->DeregisterMemory(*d2).ok());
}

TEST(Engine, PeersAreCheckedAndReplaceable) {
  auto a = Make("pa"), b = Make("pb");
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> x(64), y(64);
  auto xd = a->RegisterMemory(x.data(), 64);
  auto yd = b->RegisterMemory(y.data(), 64);
  // No session before AddPeer.
  EXPECT_EQ(a->OpenSession(*xd, *yd).status().code(), Code::kFailedPrecondition);
  EngineDesc bad = b->Describe();
  bad.protocol_version = 99;
  EXPECT_EQ(a->AddPeer(bad).code(), Code::kFailedPrecondition);
  EXPECT_EQ(a->AddPeer(EngineDesc{}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(a->AddPeer(b->Describe()).ok());
  ASSERT_TRUE(a->AddPeer(b->Describe()).ok());  // replacing is fine
  auto s = a->OpenSession(*xd, *yd);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // The local descriptor must be this engine's; the remote one must exist.
  EXPECT_EQ(a->OpenSession(*yd, *yd).status().code(), Code::kInvalidArgument);
  MemoryDesc ghost = *yd;
  ghost.region = static_cast<RegionId>(999);
  EXPECT_EQ(a->OpenSession(*xd, ghost).status().code(), Code::kFailedPrecondition);
  MemoryDesc lying = *yd;
  lying.size = 1 << 20;  // larger than what b registered
  EXPECT_EQ(a->OpenSession(*xd, lying).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(a->RemovePeer("pb").ok());
  EXPECT_EQ(a->RemovePeer("pb").code(), Code::kNotFound);
  EXPECT_EQ(a->OpenSession(*xd, *yd).status().code(), Code::kFailedPrecondition);
  // A session opened before RemovePeer keeps working.
  x[0] = 42;
  EXPECT_TRUE(s->Write(0, 0, 1).Wait().ok());
  EXPECT_EQ(y[0], 42);
}

TEST(Engine, AnEngineReachesItself) {
  auto e = Make();
  ASSERT_TRUE(e);
  std::vector<uint8_t> buf = testing::RandomBytes(8192, 1);
  auto d = e->RegisterMemory(buf.data(), buf.size());
  ASSERT_TRUE(d.ok());
  auto s = e->OpenSession(*d, *d);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Write(0, 4096, 4096).Wait().ok());
  EXPECT_EQ(std::memcmp(buf.data(), buf.data() + 4096, 4096), 0);
  ASSERT_TRUE(e->Notify(e->key(), "self").ok());
  EXPECT_EQ(e->PopNotifications().at(0).message, "self");
}

TEST(Engine, EmptyHandlesFailCleanly) {
  Session s;
  EXPECT_FALSE(s.valid());
  EXPECT_EQ(s.Write(0, 0, 1).Wait().code(), Code::kFailedPrecondition);
  Transfer t;
  EXPECT_TRUE(t.Test());
  EXPECT_EQ(t.Wait().code(), Code::kFailedPrecondition);
  EXPECT_EQ(t.bytes(), 0u);
}

TEST(Engine, VersionIsSemantic) { EXPECT_EQ(std::count(Version().begin(), Version().end(), '.'), 2); }

}  // namespace
}  // namespace ferry
