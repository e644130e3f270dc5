// A batch's ops are read from the caller once: the engine checks its own copy and hands the
// transport that copy, never the caller's array. The transport here is `local` behind a
// channel that, when a batch reaches it, rewrites the caller's array (as another thread could
// between the check and the copy) before it forwards the batch; the target region is 4 KiB in
// the middle of a larger buffer whose other bytes must stay as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <mutex>

#include "engine/engine_core.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {

Result<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

namespace {

using namespace std::chrono_literals;

std::mutex g_mu;
std::function<void()> g_on_post;       // GUARDED_BY(g_mu); runs as a batch reaches the channel
std::vector<TransferOp> g_posted;      // GUARDED_BY(g_mu); the ops the channel was handed
const TransferOp* g_posted_data;       // GUARDED_BY(g_mu); where they were

class MeddlingChannel final : public Channel {
 public:
  explicit MeddlingChannel(std::unique_ptr<Channel> inner) : inner_(std::move(inner)) {}
  Status Post(Op op, std::span<const TransferOp> ops, uint64_t total_bytes,
              const std::shared_ptr<TransferState>& state) override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_on_post) g_on_post();
      g_posted.assign(ops.begin(), ops.end());
      g_posted_data = ops.data();
    }
    return inner_->Post(op, ops, total_bytes, state);
  }
  TransferPath path() const override { return inner_->path(); }

 private:
  std::unique_ptr<Channel> inner_;
};

class MeddlingEndpoint final : public Endpoint {
 public:
  explicit MeddlingEndpoint(std::shared_ptr<Endpoint> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Channel>> OpenChannel(const std::shared_ptr<Region>& local, const MemoryDesc& remote) override {
    FERRY_ASSIGN_OR_RETURN(auto ch, inner_->OpenChannel(local, remote));
    return std::unique_ptr<Channel>(new MeddlingChannel(std::move(ch)));
  }
  Status Notify(std::string_view m) override { return inner_->Notify(m); }

 private:
  std::shared_ptr<Endpoint> inner_;
};

class MeddlingTransport final : public WrappedTransport {
 public:
  using WrappedTransport::WrappedTransport;

 protected:
  std::shared_ptr<Endpoint> Wrap(std::shared_ptr<Endpoint> ep) override {
    return std::make_shared<MeddlingEndpoint>(std::move(ep));
  }
};

Result<std::unique_ptr<Transport>> MakeMeddling(const TransportContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(auto inner, MakeLocalTransport(ctx));
  return std::unique_ptr<Transport>(new MeddlingTransport(std::move(inner)));
}

constexpr uint64_t kGuard = 1 << 20;   // bytes of the target buffer on each side of the region
constexpr uint64_t kRegion = 4096;
constexpr uint8_t kCanary = 0xAB;

// Engine a's buffer, and engine b's buffer with the 4 KiB target region in its middle.
struct Rig {
  std::vector<uint8_t> a_buf = std::vector<uint8_t>(kRegion, 0x5A);
  std::vector<uint8_t> b_buf = std::vector<uint8_t>(2 * kGuard + kRegion, kCanary);
  std::shared_ptr<EngineCore> a, b;
  std::shared_ptr<SessionCore> core;

  static std::unique_ptr<Rig> Make(bool merge) {
    static std::atomic<int> counter{0};
    const TransportEntry entries[] = {{"local", &MakeMeddling}};
    auto r = std::make_unique<Rig>();
    EngineOptions options;
    options.default_deadline = 10s;
    options.merge_adjacent_ops = merge;
    const std::string n = std::to_string(counter++);
    options.key = "ops-a" + n;
    auto a = EngineCore::Create(options, entries);
    options.key = "ops-b" + n;
    auto b = EngineCore::Create(options, entries);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    r->a = *a;
    r->b = *b;
    auto ad = r->a->RegisterMemory(r->a_buf.data(), kRegion, MemoryKind::kHost, -1);
    auto bd = r->b->RegisterMemory(r->b_buf.data() + kGuard, kRegion, MemoryKind::kHost, -1);
    EXPECT_TRUE(ad.ok() && bd.ok());
    if (!ad.ok() || !bd.ok()) return nullptr;
    EXPECT_TRUE(r->a->AddPeer(r->b->desc()).ok());
    auto s = r->a->OpenSession(*ad, *bd);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    r->core = *s;
    return r;
  }
  ~Rig() {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_on_post = nullptr;
    }
    core.reset();
    if (a) a->Shutdown();
    if (b) b->Shutdown();
  }
  // The bytes of b's buffer outside the region that differ from the canary.
  size_t GuardBytesChanged() const {
    auto changed = [](auto first, auto last) {
      return static_cast<size_t>(std::count_if(first, last, [](uint8_t v) { return v != kCanary; }));
    };
    return changed(b_buf.begin(), b_buf.begin() + kGuard) + changed(b_buf.begin() + kGuard + kRegion, b_buf.end());
  }
};

class OpsCopy : public ::testing::TestWithParam<bool> {};

TEST_P(OpsCopy, TheTransportMovesTheCheckedCopyNotTheCallersArray) {
  auto r = Rig::Make(GetParam());
  ASSERT_TRUE(r);
  // Ops that merge into one (adjacent runs) or stay apart, all inside the region.
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < 16; ++i) ops.push_back({i * 256, i * 256, GetParam() ? 256u : 128u});
  {
    std::lock_guard<std::mutex> lock(g_mu);
    // What another thread could do once the batch was checked: send every op 512 KiB past
    // the region's end, into b's guard bytes.
    g_on_post = [&ops] {
      for (auto& o : ops) o.remote_offset += 512 << 10;
    };
  }
  // SessionCore::Post is what Session::WriteBatch calls with the caller's span.
  Transfer t = r->core->Post(Op::kWrite, ops, {});
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(r->GuardBytesChanged(), 0u);
  std::lock_guard<std::mutex> lock(g_mu);
  EXPECT_FALSE(g_posted_data >= ops.data() && g_posted_data < ops.data() + ops.size())
      << "the transport was handed the caller's array";
  for (const TransferOp& o : g_posted) EXPECT_LE(o.remote_offset + o.size, kRegion);
  EXPECT_EQ(g_posted.size(), GetParam() ? 1u : 16u);
  EXPECT_TRUE(std::all_of(r->b_buf.begin() + kGuard, r->b_buf.begin() + kGuard + (GetParam() ? 4096 : 128),
                          [](uint8_t v) { return v == 0x5A; }));
}

TEST_P(OpsCopy, AReadMovesTheCheckedCopyToo) {
  auto r = Rig::Make(GetParam());
  ASSERT_TRUE(r);
  std::vector<uint8_t> a_before = r->a_buf;
  std::vector<TransferOp> ops = {{0, 0, 64}, {64, 64, 64}};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on_post = [&ops] {
      for (auto& o : ops) o.remote_offset += 512 << 10;  // would read b's guard bytes
    };
  }
  Transfer t = r->core->Post(Op::kRead, ops, {});
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  // The region's bytes (canary, as b never wrote them) arrived; what was checked was read.
  std::lock_guard<std::mutex> lock(g_mu);
  for (const TransferOp& o : g_posted) EXPECT_LE(o.remote_offset + o.size, kRegion);
}

INSTANTIATE_TEST_SUITE_P(MergeOnAndOff, OpsCopy, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "merged" : "unmerged"; });

}  // namespace
}  // namespace ferry::internal
