// A write batch's notification follows the data of every write the session posted before it,
// whatever order the batches complete in (lanes, workers and copy engines finish them out of
// order). The transport here is `local` behind a channel that holds every batch until the test
// releases it, so the completion order is the test's.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "engine/engine_core.h"
#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;

// The batches held, in posting order.
struct Held {
  Channel* inner;
  Op op;
  std::vector<TransferOp> ops;
  uint64_t total;
  std::shared_ptr<TransferState> state;
};
std::mutex g_mu;
std::deque<Held> g_held;  // GUARDED_BY(g_mu)

size_t HeldCount() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_held.size();
}

// Runs (or fails) the i-th batch held (posting order among those still held).
void Release(size_t i, Status fail = Status::Ok()) {
  Held h;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ASSERT_LT(i, g_held.size());
    h = std::move(g_held[i]);
    g_held.erase(g_held.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (fail.ok()) {
    Status s = h.inner->Post(h.op, h.ops, h.total, h.state);
    if (!s.ok()) h.state->Finish(s);
  }
  h.state->PartDone(fail);  // the part the holding channel took
}

class HeldChannel final : public Channel {
 public:
  explicit HeldChannel(std::unique_ptr<Channel> inner) : inner_(std::move(inner)) {}
  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    state->AddParts(1);
    std::lock_guard<std::mutex> lock(g_mu);
    g_held.push_back({inner_.get(), op, std::vector<TransferOp>(ops.begin(), ops.end()), total_bytes, state});
    return Status::Ok();
  }
  TransferPath path() const override { return inner_->path(); }

 private:
  std::unique_ptr<Channel> inner_;
};

class HeldEndpoint final : public Endpoint {
 public:
  explicit HeldEndpoint(std::shared_ptr<Endpoint> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    FERRY_ASSIGN_OR_RETURN(auto ch, inner_->OpenChannel(local, remote));
    return std::unique_ptr<Channel>(new HeldChannel(std::move(ch)));
  }
  Status Notify(std::string_view m) override { return inner_->Notify(m); }
  void NotifyPart(std::string m, const std::shared_ptr<TransferState>& s) override { inner_->NotifyPart(std::move(m), s); }

 private:
  std::shared_ptr<Endpoint> inner_;
};

class HeldTransport final : public WrappedTransport {
 public:
  using WrappedTransport::WrappedTransport;

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override { return std::make_shared<HeldEndpoint>(std::move(ep)); }
};

Result<std::unique_ptr<Transport>> MakeHeld(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new HeldTransport(std::move(inner)));
}

class NotifyOrderTest : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 1 << 16;
  static constexpr uint64_t kLayer = 4096;

  void SetUp() override {
    static int counter = 0;
    const TransportEntry entries[] = {{"local", &MakeHeld}};
    EngineOptions options;
    options.default_deadline = 10s;
    options.key = "order-a" + std::to_string(counter);
    auto a = EngineCore::Create(options, entries);
    options.key = "order-b" + std::to_string(counter++);
    auto b = EngineCore::Create(options, entries);
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = *a;
    b_ = *b;
    a_buf_.assign(kBytes, 0);
    b_buf_.assign(kBytes, 0);
    ::ferry::testing::Fill(a_buf_, 3);
    auto ad = a_->RegisterMemory(a_buf_.data(), kBytes, MemoryKind::kHost, -1);
    auto bd = b_->RegisterMemory(b_buf_.data(), kBytes, MemoryKind::kHost, -1);
    ASSERT_TRUE(ad.ok() && bd.ok());
    ASSERT_TRUE(a_->AddPeer(b_->desc()).ok());
    auto s = a_->OpenSession(*ad, *bd);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    session_ = *s;
  }
  void TearDown() override {
    session_.reset();
    if (a_) a_->Shutdown();
    if (b_) b_->Shutdown();
    std::lock_guard<std::mutex> lock(g_mu);
    g_held.clear();
  }

  // Writes layer `i` (kLayer bytes at i * kLayer on both sides).
  Transfer WriteLayer(int i, std::optional<std::string> note = std::nullopt, Duration deadline = 10s) {
    TransferOptions o;
    o.notification = std::move(note);
    o.deadline = deadline;
    TransferOp op{i * kLayer, i * kLayer, kLayer};
    return session_->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), o);
  }
  bool LayerInPlace(int i) const {
    return std::memcmp(b_buf_.data() + i * kLayer, a_buf_.data() + i * kLayer, kLayer) == 0;
  }
  // Notifications that reach b within `d`.
  std::vector<Notification> NotesWithin(Duration d) {
    std::vector<Notification> got;
    auto until = std::chrono::steady_clock::now() + d;
    do {
      for (auto& n : b_->PopNotifications()) got.push_back(std::move(n));
      if (!got.empty()) break;
      std::this_thread::sleep_for(1ms);
    } while (std::chrono::steady_clock::now() < until);
    return got;
  }

  std::shared_ptr<EngineCore> a_, b_;
  std::vector<uint8_t> a_buf_, b_buf_;
  std::shared_ptr<SessionCore> session_;
};

// Layer-by-layer pushes, the last carrying the notification, completing last layer first.
TEST_F(NotifyOrderTest, ANotificationWaitsForTheSessionsEarlierWrites) {
  std::vector<Transfer> layers;
  for (int i = 0; i < 3; ++i) layers.push_back(WriteLayer(i));
  Transfer last = WriteLayer(3, "request-7 done");
  ASSERT_EQ(HeldCount(), 4u);
  Release(3);  // the notifying batch's data lands first
  EXPECT_TRUE(LayerInPlace(3));
  EXPECT_TRUE(NotesWithin(50ms).empty()) << "the notification overtook earlier layers";
  EXPECT_FALSE(last.Test());
  Release(1);
  Release(0);
  EXPECT_TRUE(NotesWithin(50ms).empty()) << "the notification overtook layer 2";
  Release(0);  // layer 2, the last one held
  ASSERT_TRUE(last.Wait().ok()) << last.status().ToString();
  for (auto& t : layers) EXPECT_TRUE(t.Wait().ok());
  auto notes = NotesWithin(2s);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "request-7 done");
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(LayerInPlace(i)) << "layer " << i;
}

// Writes that finished before the notifying batch was posted do not hold it; later writes
// do not either.
TEST_F(NotifyOrderTest, OnlyWritesPostedBeforeTheBatchAreWaitedFor) {
  Transfer done = WriteLayer(0);
  Release(0);
  ASSERT_TRUE(done.Wait().ok());
  Transfer note = WriteLayer(1, "n");
  Transfer after = WriteLayer(2);
  Release(0);  // the notifying batch; the later write stays held
  ASSERT_TRUE(note.Wait().ok()) << note.status().ToString();
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
  EXPECT_FALSE(after.Test());
  Release(0);
  EXPECT_TRUE(after.Wait().ok());
}

// An earlier write that fails: the notification is never sent (the receiver would take it to
// mean the data is complete) and the batch fails with the earlier write's error.
TEST_F(NotifyOrderTest, AnEarlierWriteThatFailsCancelsTheNotification) {
  Transfer layer0 = WriteLayer(0);
  Transfer layer1 = WriteLayer(1, "never");
  Release(1);
  Release(0, Status(Code::kUnavailable, "the link went down"));
  EXPECT_EQ(layer0.Wait().code(), Code::kUnavailable);
  Status s = layer1.Wait();
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("earlier write"), std::string_view::npos) << s.ToString();
  EXPECT_TRUE(NotesWithin(100ms).empty());
  // The session still works.
  Transfer again = WriteLayer(2, "after");
  Release(0);
  ASSERT_TRUE(again.Wait().ok()) << again.status().ToString();
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
}

// An earlier write that never completes: the notifying batch ends at its own deadline and no
// notification is sent, even when the earlier write completes later.
TEST_F(NotifyOrderTest, AStalledEarlierWriteEndsTheBatchAtItsDeadline) {
  Transfer stalled = WriteLayer(0);
  Transfer note = WriteLayer(1, "late", 200ms);
  Release(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(note.Wait().code(), Code::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  Release(0);
  EXPECT_TRUE(stalled.Wait().ok());
  EXPECT_TRUE(NotesWithin(100ms).empty()) << "a notification left after its batch had ended";
}

}  // namespace
}  // namespace ferry::internal
