// Routing of notifications for sessions whose transport has none of its own (cuda_ipc): the
// engine sends them through another transport that reaches the peer, once the batch's data is
// complete. The data transport here is `local` with its notifications hidden (as cuda_ipc
// declares none), the notification transport `ucx`; both run without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "engine/engine_core.h"
#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);
Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;

std::atomic<int> g_mute_notifies{0};

class MuteEndpoint final : public Endpoint {
 public:
  explicit MuteEndpoint(std::shared_ptr<Endpoint> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    return inner_->OpenChannel(local, remote);
  }
  Status Notify(std::string_view) override {
    ++g_mute_notifies;
    return Status(Code::kUnsupported, "this transport carries no notifications");
  }
  void NotifyPart(std::string, const std::shared_ptr<TransferState>& state) override {
    ++g_mute_notifies;
    state->AddParts(1);
    state->PartDone(Status(Code::kUnsupported, "this transport carries no notifications"));
  }

 private:
  std::shared_ptr<Endpoint> inner_;
};

// The local transport, declaring no notifications and refusing to send any.
class MuteTransport final : public WrappedTransport {
 public:
  using WrappedTransport::WrappedTransport;
  Capabilities caps() const override {
    Capabilities c = WrappedTransport::caps();
    c.notifications = false;
    return c;
  }

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override { return std::make_shared<MuteEndpoint>(std::move(ep)); }
};

Result<std::unique_ptr<Transport>> MakeMute(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new MuteTransport(std::move(inner)));
}

struct Rig {
  std::vector<uint8_t> a_buf, b_buf;
  std::shared_ptr<EngineCore> a, b;
  std::shared_ptr<SessionCore> session;

  static std::unique_ptr<Rig> Make(std::span<const TransportEntry> entries, size_t bytes) {
    static std::atomic<int> counter{0};
    auto r = std::make_unique<Rig>();
    EngineOptions options;
    options.default_deadline = 10s;
    const std::string n = std::to_string(counter++);
    options.key = "route-a" + n;
    auto a = EngineCore::Create(options, entries);
    options.key = "route-b" + n;
    auto b = EngineCore::Create(options, entries);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    r->a = *a;
    r->b = *b;
    r->a_buf.assign(bytes, 0);
    r->b_buf.assign(bytes, 0);
    auto ad = r->a->RegisterMemory(r->a_buf.data(), bytes, MemoryKind::kHost, -1);
    auto bd = r->b->RegisterMemory(r->b_buf.data(), bytes, MemoryKind::kHost, -1);
    EXPECT_TRUE(ad.ok() && bd.ok());
    if (!ad.ok() || !bd.ok()) return nullptr;
    EXPECT_TRUE(r->a->AddPeer(r->b->desc()).ok());
    EXPECT_TRUE(r->b->AddPeer(r->a->desc()).ok());
    auto s = r->a->OpenSession(*ad, *bd);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    r->session = *s;
    return r;
  }
  ~Rig() {
    session.reset();
    if (a) a->Shutdown();
    if (b) b->Shutdown();
  }
};

std::vector<Notification> WaitForNotes(EngineCore& e, size_t n) {
  std::vector<Notification> got;
  auto until = std::chrono::steady_clock::now() + 10s;
  while (got.size() < n && std::chrono::steady_clock::now() < until) {
    for (auto& x : e.PopNotifications()) got.push_back(std::move(x));
    if (got.size() < n) std::this_thread::sleep_for(1ms);
  }
  return got;
}

TEST(NotifyRoute, NotificationsOfAMuteTransportGoThroughAnother) {
  const TransportEntry entries[] = {{"local", &MakeMute}, {"ucx", &MakeUcxTransport}};
  auto rig = Rig::Make(entries, 1 << 20);
  ASSERT_TRUE(rig);
  EXPECT_EQ(rig->session->path().transport, "local");  // the data stays on the cheapest route
  g_mute_notifies = 0;
  ::ferry::testing::Fill(rig->a_buf, 5);
  for (int i = 0; i < 20; ++i) {
    TransferOptions o;
    o.notification = "batch-" + std::to_string(i);
    TransferOp op{static_cast<uint64_t>(i) * 4096, static_cast<uint64_t>(i) * 4096, 4096};
    Transfer t = rig->session->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), o);
    ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
    // The data of the batch is in place before its notification is delivered.
    ASSERT_EQ(std::memcmp(rig->b_buf.data() + op.remote_offset, rig->a_buf.data() + op.local_offset, op.size), 0);
  }
  auto notes = WaitForNotes(*rig->b, 20);
  ASSERT_EQ(notes.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(notes[i].from, rig->a->key());
    EXPECT_EQ(notes[i].message, "batch-" + std::to_string(i));
  }
  EXPECT_EQ(g_mute_notifies.load(), 0);
  // Engine::Notify takes the same route.
  EXPECT_TRUE(rig->a->Notify(rig->b->key(), "direct").ok());
  auto direct = WaitForNotes(*rig->b, 1);
  ASSERT_EQ(direct.size(), 1u);
  EXPECT_EQ(direct[0].message, "direct");
  EXPECT_EQ(g_mute_notifies.load(), 0);
}

TEST(NotifyRoute, WithoutAnyNotificationTransportAWriteWithANotificationFailsBeforeMoving) {
  const TransportEntry entries[] = {{"local", &MakeMute}};
  auto rig = Rig::Make(entries, 1 << 16);
  ASSERT_TRUE(rig);
  ::ferry::testing::Fill(rig->a_buf, 9);
  TransferOptions o;
  o.notification = "never";
  TransferOp op{0, 0, 1024};
  Transfer t = rig->session->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), o);
  EXPECT_EQ(t.Wait().code(), Code::kUnavailable);
  EXPECT_EQ(rig->b_buf[0], 0);
  EXPECT_EQ(rig->a->Notify(rig->b->key(), "x").code(), Code::kUnavailable);
  // Writes without a notification still go.
  Transfer plain = rig->session->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), {});
  ASSERT_TRUE(plain.Wait().ok()) << plain.status().ToString();
  EXPECT_EQ(std::memcmp(rig->b_buf.data(), rig->a_buf.data(), 1024), 0);
  EXPECT_EQ(g_mute_notifies.load(), 0);
}

}  // namespace
}  // namespace ferry::internal
