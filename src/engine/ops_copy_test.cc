// A batch's ops are read from the caller once: the engine checks its own copy and hands the
// transport that copy, never the caller's array. The transport here is `local` behind an
// interposer that, when a batch reaches it, rewrites the caller's array (as another thread could
// between the check and the copy) before it forwards the batch; the target region is 4 KiB in
// the middle of a larger buffer whose other bytes must stay as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "base/mutex.h"
#include "testing/core_pair.h"
#include "testing/wrapped_transport.h"

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

Mutex g_mu;
std::function<void()> g_on_post GUARDED_BY(g_mu);     // runs as a batch reaches the interposer
std::vector<TransferOp> g_posted GUARDED_BY(g_mu);    // the ops the channel was handed
const TransferOp* g_posted_data GUARDED_BY(g_mu);     // where they were
Duration g_wait_spin GUARDED_BY(g_mu);                // the posted transfer's wait_spin

class Meddle final : public Interposer {
 public:
  Status Post(Channel& inner, const std::shared_ptr<Region>&, Op op, std::span<const TransferOp> ops,
              uint64_t total_bytes, const std::shared_ptr<TransferState>& state) override {
    {
      MutexLock lock(&g_mu);
      if (g_on_post) g_on_post();
      g_posted.assign(ops.begin(), ops.end());
      g_posted_data = ops.data();
      g_wait_spin = state->wait_spin();
    }
    return inner.Post(op, ops, total_bytes, state);
  }
};

constexpr uint64_t kGuard = 1 << 20;   // bytes of the target buffer on each side of the region
constexpr uint64_t kRegion = 4096;
constexpr uint8_t kCanary = 0xAB;

// Engine a's buffer, and engine b's buffer with the 4 KiB target region in its middle.
struct Rig {
  std::unique_ptr<CorePair> pair;
  std::vector<uint8_t>& b_buf() { return pair->b_buf; }

  static std::unique_ptr<Rig> Make(bool merge, Duration wait_spin = EngineOptions{}.wait_spin) {
    const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Meddle>}};
    EngineOptions options;
    options.default_deadline = 10s;
    options.wait_spin = wait_spin;
    options.merge_adjacent_ops = merge;
    options.key = "ops";
    auto r = std::make_unique<Rig>();
    r->pair = CorePair::Make(entries, options, std::vector<uint8_t>(kRegion, 0x5A),
                             std::vector<uint8_t>(2 * kGuard + kRegion, kCanary), kGuard);
    return r->pair ? std::move(r) : nullptr;
  }
  ~Rig() {
    MutexLock lock(&g_mu);
    g_on_post = nullptr;
  }
  // The bytes of b's buffer outside the region that differ from the canary.
  size_t GuardBytesChanged() const {
    const std::vector<uint8_t>& b = pair->b_buf;
    auto changed = [](auto first, auto last) {
      return static_cast<size_t>(std::count_if(first, last, [](uint8_t v) { return v != kCanary; }));
    };
    return changed(b.begin(), b.begin() + kGuard) + changed(b.begin() + kGuard + kRegion, b.end());
  }
};

class OpsCopy : public ::testing::TestWithParam<bool> {};

// Transfer::Wait polls a GPU copy without sleeping for the engine's wait_spin: every posted
// transfer carries it (the pacing itself: base/poll_pacer_test.cc).
TEST(OpsCopyWaitSpin, EveryPostedTransferCarriesTheEnginesWaitSpin) {
  for (Duration spin : {Duration::zero(), Duration(7ms), EngineOptions{}.wait_spin}) {
    auto r = Rig::Make(false, spin);
    ASSERT_TRUE(r);
    Transfer t = r->pair->session->Post(Op::kWrite, std::vector<TransferOp>{{0, 0, 64}}, {});
    ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
    MutexLock lock(&g_mu);
    EXPECT_EQ(g_wait_spin, spin);
  }
  EXPECT_EQ(EngineOptions{}.wait_spin, 2ms);
}

TEST_P(OpsCopy, TheTransportMovesTheCheckedCopyNotTheCallersArray) {
  auto r = Rig::Make(GetParam());
  ASSERT_TRUE(r);
  // Ops that merge into one (adjacent runs) or stay apart, all inside the region.
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < 16; ++i) ops.push_back({i * 256, i * 256, GetParam() ? 256u : 128u});
  {
    MutexLock lock(&g_mu);
    // What another thread could do once the batch was checked: send every op 512 KiB past
    // the region's end, into b's guard bytes.
    g_on_post = [&ops] {
      for (auto& o : ops) o.remote_offset += 512 << 10;
    };
  }
  // SessionCore::Post is what Session::WriteBatch calls with the caller's span.
  Transfer t = r->pair->session->Post(Op::kWrite, ops, {});
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(r->GuardBytesChanged(), 0u);
  MutexLock lock(&g_mu);
  EXPECT_FALSE(g_posted_data >= ops.data() && g_posted_data < ops.data() + ops.size())
      << "the transport was handed the caller's array";
  for (const TransferOp& o : g_posted) EXPECT_LE(o.remote_offset + o.size, kRegion);
  EXPECT_EQ(g_posted.size(), GetParam() ? 1u : 16u);
  EXPECT_TRUE(std::all_of(r->b_buf().begin() + kGuard, r->b_buf().begin() + kGuard + (GetParam() ? 4096 : 128),
                          [](uint8_t v) { return v == 0x5A; }));
}

TEST_P(OpsCopy, AReadMovesTheCheckedCopyToo) {
  auto r = Rig::Make(GetParam());
  ASSERT_TRUE(r);
    std::vector<TransferOp> ops = {{0, 0, 64}, {64, 64, 64}};
  {
    MutexLock lock(&g_mu);
    g_on_post = [&ops] {
      for (auto& o : ops) o.remote_offset += 512 << 10;  // would read b's guard bytes
    };
  }
  Transfer t = r->pair->session->Post(Op::kRead, ops, {});
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  // The region's bytes (canary, as b never wrote them) arrived; what was checked was read.
  MutexLock lock(&g_mu);
  for (const TransferOp& o : g_posted) EXPECT_LE(o.remote_offset + o.size, kRegion);
}

INSTANTIATE_TEST_SUITE_P(MergeOnAndOff, OpsCopy, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "merged" : "unmerged"; });

// A channel that offers storage for large batches (as the GPU paths' op buffers do): the engine
// checks the caller's ops straight into it and posts from it.
struct Offered {
  int reserved = 0;               // ReserveOps calls
  int live = 0;                   // spaces not yet destroyed
  int posted = 0;                 // PostReserved calls
  bool posted_from_space = false;  // the ops handed over lie at the space's start
  uint64_t max_op_size = 0;       // as the engine set it
  size_t ops = 0;                 // ops handed over
};
Offered g_offered GUARDED_BY(g_mu);

class HostSpace final : public OpSpace {
 public:
  explicit HostSpace(size_t n) : ops_(n) {}
  ~HostSpace() override {
    MutexLock lock(&g_mu);
    --g_offered.live;
  }
  TransferOp* data() override { return ops_.data(); }
  void set_max_op_size(uint64_t bytes) override { max_ = bytes; }
  uint64_t max() const { return max_; }

 private:
  std::vector<TransferOp> ops_;
  uint64_t max_ = 0;
};

class Offer final : public Interposer {
 public:
  std::unique_ptr<OpSpace> ReserveOps(Channel&, Op, size_t n) override {
    MutexLock lock(&g_mu);
    ++g_offered.reserved;
    ++g_offered.live;
    return std::make_unique<HostSpace>(n);
  }
  Status PostReserved(Channel& inner, const std::shared_ptr<Region>& local, Op op, OpSpace& space,
                      std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) override {
    {
      MutexLock lock(&g_mu);
      if (g_on_post) g_on_post();
      ++g_offered.posted;
      g_offered.posted_from_space = ops.data() == space.data();
      g_offered.max_op_size = static_cast<HostSpace&>(space).max();
      g_offered.ops = ops.size();
    }
    return Post(inner, local, op, ops, total_bytes, state);
  }
};

std::unique_ptr<CorePair> OfferingPair(bool merge) {
  {
    MutexLock lock(&g_mu);
    g_offered = {};
    g_on_post = nullptr;
  }
  const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Offer>}};
  EngineOptions options;
  options.default_deadline = 10s;
  options.merge_adjacent_ops = merge;
  options.key = "offer";
  std::vector<uint8_t> a(kRegion);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i % 251);
  return CorePair::Make(entries, options, std::move(a), std::vector<uint8_t>(2 * kGuard + kRegion, kCanary), kGuard);
}

TEST(OpsSpace, ALargeBatchIsCheckedIntoTheChannelsStorageAndPostedFromThere) {
  auto pair = OfferingPair(true);
  ASSERT_TRUE(pair);
  // 4096 one-byte ops, a permutation of the region's bytes (none adjacent: nothing merges).
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kRegion; ++i) ops.push_back({i, (i * 13) % kRegion, 1});
  {
    MutexLock lock(&g_mu);
    g_on_post = [&ops] {  // the caller's array changed after the check: nothing follows it
      for (auto& o : ops) o.remote_offset += 512 << 10;
    };
  }
  Transfer t = pair->session->Post(Op::kWrite, ops, {});
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  for (uint64_t i = 0; i < kRegion; ++i)
    ASSERT_EQ(pair->b_buf[kGuard + (i * 13) % kRegion], static_cast<uint8_t>(i % 251)) << "op " << i;
  MutexLock lock(&g_mu);
  EXPECT_EQ(g_offered.reserved, 1);
  EXPECT_EQ(g_offered.posted, 1);
  EXPECT_TRUE(g_offered.posted_from_space);
  EXPECT_EQ(g_offered.max_op_size, 1u);
  EXPECT_EQ(g_offered.ops, kRegion);
  EXPECT_EQ(g_offered.live, 0);
  g_on_post = nullptr;
}

TEST(OpsSpace, MergedRunsLeaveTheLongestOpUnknown) {
  auto pair = OfferingPair(true);
  ASSERT_TRUE(pair);
  std::vector<TransferOp> ops;  // 4096 adjacent one-byte ops: one run
  for (uint64_t i = 0; i < kRegion; ++i) ops.push_back({i, i, 1});
  ASSERT_TRUE(pair->session->Post(Op::kWrite, ops, {}).Wait().ok());
  EXPECT_TRUE(std::equal(pair->a_buf.begin(), pair->a_buf.end(), pair->b_buf.begin() + kGuard));
  MutexLock lock(&g_mu);
  EXPECT_EQ(g_offered.posted, 1);
  EXPECT_EQ(g_offered.max_op_size, UINT64_MAX);
  EXPECT_EQ(g_offered.ops, 1u);
}

TEST(OpsSpace, ABatchThatFailsItsCheckGivesTheStorageBackAndMovesNothing) {
  auto pair = OfferingPair(false);
  ASSERT_TRUE(pair);
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kRegion; ++i) ops.push_back({i, i, 1});
  ops[3001].remote_offset = kRegion;  // one byte past the region
  Transfer t = pair->session->Post(Op::kWrite, ops, {});
  EXPECT_EQ(t.Wait().code(), Code::kOutOfRange);
  EXPECT_NE(t.status().ToString().find("3001"), std::string::npos) << t.status().ToString();
  EXPECT_TRUE(std::all_of(pair->b_buf.begin(), pair->b_buf.end(), [](uint8_t v) { return v == kCanary; }));
  MutexLock lock(&g_mu);
  EXPECT_EQ(g_offered.reserved, 1);
  EXPECT_EQ(g_offered.posted, 0);
  EXPECT_EQ(g_offered.live, 0);
}

TEST(OpsSpace, SmallBatchesAndOwnedBatchesTakeTheirPaths) {
  auto pair = OfferingPair(false);
  ASSERT_TRUE(pair);
  std::vector<TransferOp> small = {{0, 0, 16}, {32, 32, 16}};
  ASSERT_TRUE(pair->session->Post(Op::kWrite, small, {}).Wait().ok());
  {
    MutexLock lock(&g_mu);
    EXPECT_EQ(g_offered.reserved, 0);  // under SessionCore::kReserveMinOps: the engine's own storage
  }
  // A batch handed over by value (Session::Post(vector&&)) goes into the offered storage too.
  std::vector<TransferOp> owned;
  for (uint64_t i = 0; i < kRegion; i += 2) owned.push_back({i, i, 1});
  owned.resize(SessionCore::kReserveMinOps, TransferOp{0, 0, 0});
  ASSERT_TRUE(pair->session->PostOwned(Op::kWrite, owned, {}).Wait().ok());
  for (uint64_t i = 0; i < kRegion; i += 2) ASSERT_EQ(pair->b_buf[kGuard + i], pair->a_buf[i]);
  MutexLock lock(&g_mu);
  EXPECT_EQ(g_offered.reserved, 1);
  EXPECT_EQ(g_offered.posted, 1);
  EXPECT_EQ(g_offered.live, 0);
}

}  // namespace
}  // namespace ferry::internal
