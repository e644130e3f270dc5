// The transport conformance suite: the same behaviours checked over every transport compiled
// in, each through two engines of this process restricted to that transport, once with heap
// buffers and once with shareable host buffers (ferry::AllocateSharedHost). A combination
// whose transport cannot register that memory (shm and heap memory) is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <atomic>
#include <numeric>
#include <thread>

#include "engine/test_util.h"
#include "ferry/system.h"
#include "transport/transport.h"

namespace ferry {
namespace {

using testing::EnginePair;
using testing::HostAlloc;
using testing::RandomBytes;

// A transport, the kind of host memory, and for `ucx` how many workers: with more than one,
// three lanes per peer are dealt over them (2 + 1), so batches are split over two connections
// on two threads; optionally a number of lanes and a posting batch of their own.
struct Param {
  std::string transport;
  HostAlloc alloc;
  int workers = 1;
  int lanes = 0;       // 0: 3 with several workers, else the default
  int post_batch = 0;  // 0: the default
};

class Conformance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const std::string& why = SkipReason(transport());
    if (!why.empty()) GTEST_SKIP() << why;
    // Whether the transport carries this kind of host memory at all.
    EngineOptions options;
    options.transports = {transport()};
    auto e = Engine::Create(options);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    testing::Bytes probe(4096, 0, testing::TestAllocator<uint8_t>(GetParam().alloc));
    auto d = (*e)->RegisterMemory(probe.data(), probe.size());
    if (d.status().code() == Code::kUnavailable)
      GTEST_SKIP() << transport() << " cannot register " << testing::HostAllocName(GetParam().alloc)
                   << " memory: " << d.status().ToString();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE((*e)->DeregisterMemory(*d).ok());
  }
  const std::string& transport() const { return GetParam().transport; }
  // The suite runs two engines of this process over host memory: transports that cannot
  // (cuda_ipc: GPU memory between processes) or that say they are unsupported here skip.
  // Probed once per transport.
  static const std::string& SkipReason(const std::string& name) {
    static std::map<std::string, std::string> reasons;
    auto it = reasons.find(name);
    if (it != reasons.end()) return it->second;
    std::string why;
    for (const auto& e : internal::RegisteredTransports()) {
      if (e.name != name) continue;
      EngineOptions o;
      internal::TransportContext ctx{"conformance-probe", &o, std::make_shared<internal::Inbox>(1, 1)};
      auto t = e.make(ctx);
      if (!t.ok() && t.status().code() == Code::kUnsupported) why = name + " is not usable here: " + t.status().ToString();
      if (t.ok() && !(*t)->caps().host_memory) why = name + " does not carry host memory between engines of one process";
    }
    return reasons.emplace(name, why).first->second;
  }
  std::unique_ptr<EnginePair> Pair(size_t bytes, EngineOptions options = {}) {
    options.ucx.workers = GetParam().workers;
    if (GetParam().workers > 1) options.ucx.lanes = 3;
    if (GetParam().lanes > 0) options.ucx.lanes = GetParam().lanes;
    if (GetParam().post_batch > 0) options.ucx.post_batch = GetParam().post_batch;
    auto p = EnginePair::Make(transport(), bytes, options, GetParam().alloc);
    if (p) {
      EXPECT_EQ(p->session.path().transport, transport());
    }
    return p;
  }
  // Notifications sent with Engine::Notify may be one-way (ucx): wait until `n` arrived.
  static std::vector<Notification> WaitNotifications(Engine& e, size_t n) {
    std::vector<Notification> got;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.size() < n && std::chrono::steady_clock::now() < until) {
      for (auto& x : e.PopNotifications()) got.push_back(std::move(x));
      if (got.size() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return got;
  }
};

// Scattered pieces of random sizes that never overlap on either side.
std::vector<TransferOp> ScatteredOps(size_t region, size_t count, size_t max_piece, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t slot = region / count;
  std::vector<size_t> remote_slots(count);
  std::iota(remote_slots.begin(), remote_slots.end(), 0);
  std::shuffle(remote_slots.begin(), remote_slots.end(), rng);
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < count; ++i) {
    uint64_t size = 1 + rng() % std::min(max_piece, slot);
    uint64_t lo = i * slot + rng() % (slot - size + 1);
    uint64_t ro = remote_slots[i] * slot + rng() % (slot - size + 1);
    ops.push_back({lo, ro, size});
  }
  return ops;
}

template <typename Src, typename Dst>
void ExpectApplied(const Src& src, const Dst& dst, const std::vector<TransferOp>& ops, bool write) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    uint64_t s = write ? op.local_offset : op.remote_offset;
    uint64_t d = write ? op.remote_offset : op.local_offset;
    ASSERT_EQ(std::memcmp(src.data() + s, dst.data() + d, op.size), 0) << "op " << i;
  }
}

TEST_P(Conformance, SingleWriteAndRead) {
  auto p = Pair(1 << 16);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 1);
  auto data = p->a_buf;
  Transfer t = p->session.Write(100, 200, 5000);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(t.bytes(), 5000u);
  EXPECT_EQ(t.path().transport, transport());
  EXPECT_TRUE(t.Test());
  EXPECT_EQ(std::memcmp(p->b_buf.data() + 200, data.data() + 100, 5000), 0);
  EXPECT_EQ(p->b_buf[199], 0);
  EXPECT_EQ(p->b_buf[5200], 0);

  std::fill(p->a_buf.begin(), p->a_buf.end(), 0);
  Transfer r = p->session.Read(7, 200, 5000);
  ASSERT_TRUE(r.Wait().ok()) << r.status().ToString();
  EXPECT_EQ(std::memcmp(p->a_buf.data() + 7, data.data() + 100, 5000), 0);
}

TEST_P(Conformance, BatchedWritesAndReadsKeepEveryByte) {
  const size_t kBytes = 8 << 20;
  auto p = Pair(kBytes);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 2);
  auto ops = ScatteredOps(kBytes, 4096, 2000, 3);
  ASSERT_TRUE(p->session.WriteBatch(ops).Wait().ok());
  ExpectApplied(p->a_buf, p->b_buf, ops, true);

  testing::Fill(p->b_buf, 4);
  auto rops = ScatteredOps(kBytes, 1000, 8000, 5);
  Transfer t = p->session.ReadBatch(rops);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  ExpectApplied(p->b_buf, p->a_buf, rops, false);
}

TEST_P(Conformance, LargeBatchesSplitAcrossThreadsStayExact) {
  const size_t kBytes = 64 << 20;
  EngineOptions options;
  options.copy_threads = 4;
  options.parallel_copy_bytes = 1 << 20;
  auto p = Pair(kBytes, options);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 6);
  // Pieces of uneven sizes so that part boundaries fall inside pieces.
  auto ops = ScatteredOps(kBytes, 97, 600000, 7);
  Transfer t = p->session.WriteBatch(ops);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  ExpectApplied(p->a_buf, p->b_buf, ops, true);
  // One piece as large as the region.
  std::vector<TransferOp> whole = {{0, 0, kBytes}};
  ASSERT_TRUE(p->session.WriteBatch(whole).Wait().ok());
  EXPECT_EQ(p->a_buf, p->b_buf);
}

// KV blocks allocated in runs: adjacent ops are merged before they reach the transport
// (EngineOptions::merge_adjacent_ops), and every byte still lands where its op says, with the
// gaps between runs untouched; with merging off the same batch gives the same bytes.
TEST_P(Conformance, RunsOfAdjacentOpsTravelMergedAndExact) {
  const size_t kBytes = 4 << 20;
  const uint64_t kBlock = 4096;
  // 64 runs of 1..15 blocks, a block's gap between runs locally, runs shuffled remotely.
  std::mt19937_64 rng(17);
  std::vector<uint64_t> run_blocks;
  for (int r = 0; r < 64; ++r) run_blocks.push_back(1 + rng() % 15);
  std::vector<size_t> order(run_blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint64_t> remote_start(run_blocks.size());
  uint64_t ro = 0;
  for (size_t r : order) {
    remote_start[r] = ro;
    ro += (run_blocks[r] + 1) * kBlock;
  }
  std::vector<TransferOp> ops;
  uint64_t lo = 0, joins = 0;
  for (size_t r = 0; r < run_blocks.size(); ++r) {
    for (uint64_t b = 0; b < run_blocks[r]; ++b) ops.push_back({lo + b * kBlock, remote_start[r] + b * kBlock, kBlock});
    joins += run_blocks[r] - 1;
    lo += (run_blocks[r] + 1) * kBlock;
  }
  ops.push_back({0, 0, 0});  // an empty op joins too
  ++joins;
  ASSERT_LE(lo, kBytes);
  ASSERT_LE(ro, kBytes);

  for (bool merge : {true, false}) {
    SCOPED_TRACE(merge ? "merging" : "not merging");
    EngineOptions options;
    options.merge_adjacent_ops = merge;
    auto p = Pair(kBytes, options);
    ASSERT_TRUE(p);
    testing::Fill(p->a_buf, 21);
    Transfer t = p->session.WriteBatch(ops);
    ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
    EXPECT_EQ(t.bytes(), ops.size() > 0 ? (ops.size() - 1) * kBlock : 0);
    ExpectApplied(p->a_buf, p->b_buf, ops, true);
    // The block after each run, remotely, was not written.
    for (size_t r = 0; r < run_blocks.size(); ++r) {
      const uint64_t gap = remote_start[r] + run_blocks[r] * kBlock;
      ASSERT_TRUE(std::all_of(p->b_buf.begin() + gap, p->b_buf.begin() + gap + kBlock, [](uint8_t v) { return v == 0; }))
          << "run " << r;
    }
    EXPECT_EQ(p->a->stats().merged_ops, merge ? joins : 0);

    // And back: reads of the same runs.
    std::fill(p->a_buf.begin(), p->a_buf.end(), 0);
    Transfer r = p->session.ReadBatch(ops);
    ASSERT_TRUE(r.Wait().ok()) << r.status().ToString();
    ExpectApplied(p->b_buf, p->a_buf, ops, false);
    EXPECT_EQ(p->a->stats().merged_ops, merge ? 2 * joins : 0);
  }
}

TEST_P(Conformance, OutOfRangeMovesNothing) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 8);
  struct Case {
    TransferOp op;
  } cases[] = {{{0, 4000, 100}}, {{4000, 0, 100}}, {{4097, 0, 0}}, {{0, 0, 4097}},
               {{UINT64_MAX, 0, 2}}, {{0, UINT64_MAX - 1, 8}}, {{1, 1, UINT64_MAX}}};
  for (const auto& c : cases) {
    // A good op first: the whole batch must fail before any byte moves.
    std::vector<TransferOp> ops = {{0, 0, 64}, c.op};
    Status w = p->session.WriteBatch(ops).Wait();
    EXPECT_EQ(w.code(), Code::kOutOfRange) << w.ToString();
    Status r = p->session.ReadBatch(ops).Wait();
    EXPECT_EQ(r.code(), Code::kOutOfRange) << r.ToString();
  }
  EXPECT_TRUE(std::all_of(p->b_buf.begin(), p->b_buf.end(), [](uint8_t v) { return v == 0; }));
  Status single = p->session.Write(0, 4095, 2).Wait();
  EXPECT_EQ(single.code(), Code::kOutOfRange);
  EXPECT_NE(single.message().find("remote offset 4095"), std::string_view::npos) << single.ToString();
  // Exactly the end of both regions is fine; so is an empty op at the end.
  EXPECT_TRUE(p->session.Write(4032, 4032, 64).Wait().ok());
  EXPECT_TRUE(p->session.Write(4096, 4096, 0).Wait().ok());
}

TEST_P(Conformance, EmptyBatchSucceeds) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  Transfer t = p->session.WriteBatch({});
  EXPECT_TRUE(t.Test());
  EXPECT_TRUE(t.Wait().ok());
  EXPECT_EQ(t.bytes(), 0u);
  EXPECT_TRUE(p->session.ReadBatch({}).Wait().ok());
}

TEST_P(Conformance, DeregisteredRegionsFailCleanly) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->b->DeregisterMemory(p->b_desc).ok());
  Status s = p->session.Write(0, 0, 64).Wait();
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
  auto reopened = p->a->OpenSession(p->a_desc, p->b_desc);
  EXPECT_EQ(reopened.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(p->b->DeregisterMemory(p->b_desc).code(), Code::kNotFound);

  auto q = Pair(4096);
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->a->DeregisterMemory(q->a_desc).ok());
  EXPECT_EQ(q->session.Read(0, 0, 64).Wait().code(), Code::kFailedPrecondition);
}

TEST_P(Conformance, DeadlinesEndSlowTransfers) {
  const size_t kBytes = 64 << 20;
  EngineOptions options;
  options.copy_threads = 2;
  options.parallel_copy_bytes = 1 << 20;
  options.default_deadline = std::chrono::nanoseconds(1);
  auto p = Pair(kBytes, options);
  ASSERT_TRUE(p);
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kBytes; off += 4096) ops.push_back({off, off, 4096});
  // The engine's default deadline (1 ns) passes before 64 MiB can move.
  Transfer t = p->session.WriteBatch(ops);
  EXPECT_EQ(t.Wait().code(), Code::kDeadlineExceeded);
  EXPECT_EQ(t.status().code(), Code::kDeadlineExceeded);
  // Bytes of the expired batch may still land; the next batches go to another region.
  testing::Bytes other(kBytes, 0, p->b_buf.get_allocator());
  auto other_desc = p->b->RegisterMemory(other.data(), kBytes);
  ASSERT_TRUE(other_desc.ok());
  auto s = p->a->OpenSession(p->a_desc, *other_desc);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // A per-call deadline overrides the default.
  TransferOptions generous;
  generous.deadline = std::chrono::seconds(60);
  EXPECT_TRUE(s->WriteBatch(ops, generous).Wait().ok());
  // WaitFor returns early without ending the transfer.
  TransferOptions later;
  later.deadline = std::chrono::seconds(60);
  Transfer u = s->WriteBatch(ops, later);
  Status early = u.WaitFor(std::chrono::nanoseconds(1));
  EXPECT_TRUE(early.code() == Code::kInProgress || early.ok()) << early.ToString();
  EXPECT_TRUE(u.Wait().ok());
}

TEST_P(Conformance, NotificationFollowsItsData) {
  auto p = Pair(1 << 20);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 9);
  auto ops = ScatteredOps(1 << 20, 256, 2048, 10);
  TransferOptions options;
  options.notification = "layer-31-done";
  ASSERT_TRUE(p->session.WriteBatch(ops, options).Wait().ok());
  auto got = p->b->PopNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].from, p->a->key());
  EXPECT_EQ(got[0].message, "layer-31-done");
  ExpectApplied(p->a_buf, p->b_buf, ops, true);
  EXPECT_TRUE(p->b->PopNotifications().empty());

  // An empty batch may carry a notification too.
  options.notification = "empty";
  ASSERT_TRUE(p->session.WriteBatch({}, options).Wait().ok());
  EXPECT_EQ(p->b->PopNotifications().at(0).message, "empty");
  // Reads carry none.
  EXPECT_EQ(p->session.Read(0, 0, 8, options).Wait().code(), Code::kInvalidArgument);
  // A failed batch sends none.
  EXPECT_EQ(p->session.Write(0, 1 << 20, 8, options).Wait().code(), Code::kOutOfRange);
  EXPECT_TRUE(p->b->PopNotifications().empty());
}

TEST_P(Conformance, DirectNotificationsArriveInOrder) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(p->a->Notify(p->b->key(), "note " + std::to_string(i)).ok());
  std::string binary("\x00\xff\x00", 3);
  ASSERT_TRUE(p->b->Notify(p->a->key(), binary).ok());
  auto got = WaitNotifications(*p->b, 100);
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i].message, "note " + std::to_string(i));
  EXPECT_EQ(got[0].from, p->a->key());
  auto back = WaitNotifications(*p->a, 1);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].message, binary);
  EXPECT_TRUE(p->b->PopNotifications().empty());
  EXPECT_EQ(p->a->Notify("nobody", "x").code(), Code::kFailedPrecondition);
  EXPECT_EQ(p->a->Notify(p->b->key(), std::string(64 * 1024 + 1, 'x')).code(), Code::kInvalidArgument);
}

// Notifications sent after a batch completed, and with batches, arrive after that batch's
// data and in the order they were sent.
TEST_P(Conformance, NotificationsKeepTheirOrderAfterTheData) {
  const size_t kBytes = 1 << 20, kRounds = 32;
  auto p = Pair(kBytes);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 21);
  const uint64_t slice = kBytes / kRounds;
  for (size_t r = 0; r < kRounds; ++r) {
    std::vector<TransferOp> ops;
    for (uint64_t off = 0; off < slice; off += 4096) ops.push_back({r * slice + off, r * slice + off, 4096});
    TransferOptions options;
    if (r % 2 == 0) options.notification = "batch " + std::to_string(r);
    ASSERT_TRUE(p->session.WriteBatch(ops, options).Wait().ok());
    ASSERT_TRUE(p->a->Notify(p->b->key(), "after " + std::to_string(r)).ok());
  }
  auto got = WaitNotifications(*p->b, kRounds + kRounds / 2);
  ASSERT_EQ(got.size(), kRounds + kRounds / 2);
  size_t i = 0;
  for (size_t r = 0; r < kRounds; ++r) {
    if (r % 2 == 0) {
      EXPECT_EQ(got[i++].message, "batch " + std::to_string(r));
    }
    EXPECT_EQ(got[i++].message, "after " + std::to_string(r));
  }
  EXPECT_EQ(std::memcmp(p->a_buf.data(), p->b_buf.data(), kBytes), 0);
}

// A full inbox refuses: the sender hears of it where the notification waits for the receiver
// (a batch's notification, and Notify within a process); a one-way Notify is dropped at the
// receiver. Either way the receiver counts every refusal.
TEST_P(Conformance, FullInboxPushesBack) {
  EngineOptions options;
  options.max_pending_notifications = 4;
  auto p = Pair(4096, options);
  ASSERT_TRUE(p);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p->a->Notify(p->b->key(), "x").ok());
  Status fifth = p->a->Notify(p->b->key(), "x");
  EXPECT_TRUE(fifth.ok() || fifth.code() == Code::kResourceExhausted) << fifth.ToString();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (p->b->stats().dropped_notifications < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(p->b->stats().dropped_notifications, 1u);
  TransferOptions with_note;
  with_note.notification = "batch";
  EXPECT_EQ(p->session.Write(0, 0, 8, with_note).Wait().code(), Code::kResourceExhausted);
  EXPECT_EQ(p->b->stats().dropped_notifications, 2u);
  EXPECT_EQ(p->b->PopNotifications().size(), 4u);
  EXPECT_EQ(p->a->stats().dropped_notifications, 0u);
  EXPECT_TRUE(p->a->Notify(p->b->key(), "y").ok());
  auto got = WaitNotifications(*p->b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "y");
}

TEST_P(Conformance, ManyThreadsManySessions) {
  const size_t kThreads = 8, kSlice = 256 << 10;
  EngineOptions options;
  options.copy_threads = 2;
  options.parallel_copy_bytes = 64 << 10;
  auto p = Pair(kThreads * kSlice, options);
  ASSERT_TRUE(p);
  testing::Fill(p->a_buf, 11);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = p->a->OpenSession(p->a_desc, p->b_desc);
      if (!s.ok()) {
        failures++;
        return;
      }
      for (int round = 0; round < 20; ++round) {
        std::vector<TransferOp> ops;
        for (uint64_t off = 0; off < kSlice; off += 4096) {
          uint64_t base = t * kSlice;
          ops.push_back({base + off, base + (kSlice - 4096 - off), 4096});
        }
        if (!s->WriteBatch(ops).Wait().ok()) failures++;
        if (!s->Write(t * kSlice, t * kSlice + kSlice - 4096, 1).Wait().ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (size_t t = 0; t < kThreads; ++t) {
    for (uint64_t off = 0; off < kSlice; off += 4096) {
      uint64_t base = t * kSlice;
      ASSERT_EQ(std::memcmp(p->a_buf.data() + base + off,
                            p->b_buf.data() + base + (kSlice - 4096 - off), 4096), 0);
    }
  }
}

TEST_P(Conformance, TransferIdsAreUniqueOrGiven) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  Transfer x = p->session.Write(0, 0, 8);
  Transfer y = p->session.Write(0, 0, 8);
  EXPECT_NE(static_cast<uint64_t>(x.id()), static_cast<uint64_t>(y.id()));
  TransferOptions options;
  options.id = p->a->AllocateTransferId();
  Transfer z = p->session.Write(0, 0, 8, options);
  EXPECT_EQ(z.id(), *options.id);
  EXPECT_TRUE(x.Wait().ok() && y.Wait().ok() && z.Wait().ok());
}

TEST_P(Conformance, SessionsFailCleanlyAfterTheirEngineIsGone) {
  auto p = Pair(4096);
  ASSERT_TRUE(p);
  Session s = p->session;
  p->a.reset();
  EXPECT_EQ(s.Write(0, 0, 8).Wait().code(), Code::kAborted);
}

std::vector<Param> Params(HostAlloc alloc) {
  std::vector<Param> out;
  for (const auto& e : internal::RegisteredTransports()) {
    out.push_back(Param{std::string(e.name), alloc, 1});
    if (std::string(e.name) != "ucx") continue;
    out.push_back(Param{std::string(e.name), alloc, 2});
    // Two lanes on one worker, the worker stepped after every op posted.
    out.push_back(Param{std::string(e.name), alloc, 1, 2, 1});
  }
  return out;
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  std::string name = info.param.transport;
  if (info.param.transport == "ucx") name += "_w" + std::to_string(info.param.workers);
  if (info.param.lanes > 0) name += "_l" + std::to_string(info.param.lanes);
  if (info.param.post_batch > 0) name += "_pb" + std::to_string(info.param.post_batch);
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllTransports, Conformance, ::testing::ValuesIn(Params(HostAlloc::kHeap)), ParamName);
INSTANTIATE_TEST_SUITE_P(SharedHost, Conformance, ::testing::ValuesIn(Params(HostAlloc::kShared)), ParamName);

}  // namespace
}  // namespace ferry
