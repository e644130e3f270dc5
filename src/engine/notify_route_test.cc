// Routing of notifications for sessions whose transport has none of its own (cuda_ipc): the
// engine sends them through another transport that reaches the peer, once the batch's data is
// complete. The data transport here is `local` with its notifications hidden (as cuda_ipc
// declares none), the notification transport `ucx`; both run without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/core_pair.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;

std::atomic<int> g_mute_notifies{0};

// The local transport, declaring no notifications and refusing to send any.
class Mute final : public Interposer {
 public:
  Capabilities Caps(Capabilities c) const override {
    c.notifications = false;
    return c;
  }
  Status Notify(Endpoint&, std::string_view) override {
    ++g_mute_notifies;
    return Status(Code::kUnsupported, "this transport carries no notifications");
  }
  void NotifyPart(Endpoint&, std::string, const std::shared_ptr<TransferState>& state) override {
    ++g_mute_notifies;
    state->AddParts(1);
    state->PartDone(Status(Code::kUnsupported, "this transport carries no notifications"));
  }
};

std::unique_ptr<CorePair> MakeRig(std::span<const TransportEntry> entries, size_t bytes) {
  EngineOptions options;
  options.default_deadline = 10s;
  options.key = "route";
  return CorePair::Make(entries, options, std::vector<uint8_t>(bytes, 0), std::vector<uint8_t>(bytes, 0));
}

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
  const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Mute>}, {"ucx", &MakeUcxTransport}};
  auto rig = MakeRig(entries, 1 << 20);
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
  const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Mute>}};
  auto rig = MakeRig(entries, 1 << 16);
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
