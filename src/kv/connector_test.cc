// The KV connector between workers of this process (local and shm transports): write and read
// modes, deferral, heterogeneous TP and layouts, prefix hits, and the fail-closed ends.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <thread>

#include "kv/connector_test_util.h"

namespace ferry::kv::testing {
namespace {

// "shm_busy_poll": shm with ConnectorOptions::busy_poll on every worker.
constexpr std::string_view kBusy = "_busy_poll";

class ConnectorTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string transport() const { return GetParam(); }
};

std::string BaseTransport(const std::string& t) {
  return t.ends_with(kBusy) ? t.substr(0, t.size() - kBusy.size()) : t;
}

// One producer and one consumer instance, each of `tp` ranks.
struct Pd {
  std::vector<std::unique_ptr<Worker>> p, d;
  std::vector<Worker*> all() const {
    std::vector<Worker*> out;
    for (auto& w : p) out.push_back(w.get());
    for (auto& w : d) out.push_back(w.get());
    return out;
  }
};

Pd MakePd(const std::string& transport, uint32_t p_tp, uint32_t d_tp, TensorOrder p_order, TensorOrder d_order,
          ConnectorOptions options = {}, uint32_t p_block = 16, uint32_t d_block = 16, bool mla = false) {
  Pd pd;
  if (transport.ends_with(kBusy)) options.busy_poll = true;
  const std::string base = BaseTransport(transport);
  for (uint32_t r = 0; r < p_tp; ++r) pd.p.push_back(MakeWorker(base, "prefill", Identity(r, p_tp, p_block, mla), p_order, options));
  for (uint32_t r = 0; r < d_tp; ++r) pd.d.push_back(MakeWorker(base, "decode", Identity(r, d_tp, d_block, mla), d_order, options));
  for (auto* w : pd.all()) EXPECT_NE(w, nullptr);
  Introduce(pd.all());
  return pd;
}

// Write mode, the producer saving every layer of request `req` (tokens in p_blocks).
void SaveAll(Pd& pd, const std::string& id, uint64_t req, const std::vector<uint64_t>& p_blocks, uint64_t tokens) {
  const uint32_t layers = pd.p[0]->layout.num_layers;
  for (uint32_t layer = 0; layer < layers; ++layer) {
    for (auto& w : pd.p) {
      Fill(*w, req, layer, p_blocks, tokens);
      ASSERT_TRUE(w->conn->SaveLayer(id, layer, p_blocks).ok());
    }
  }
  for (auto& w : pd.p) ASSERT_TRUE(w->conn->Seal(id, layers).ok());
}

void ExpectDone(Worker& w, const std::string& id, size_t n = 1) {
  auto f = Collect(w, n);
  ASSERT_EQ(f.size(), n) << w.conn->id().ToString();
  for (const auto& x : f) {
    EXPECT_EQ(x.request, id);
    EXPECT_EQ(x.outcome, Outcome::kDone) << x.status.ToString();
    EXPECT_NE(x.at, std::chrono::steady_clock::time_point{});
    EXPECT_LE(x.at, std::chrono::steady_clock::now());
  }
}

uint64_t CheckAll(Pd& pd, uint64_t req, const std::vector<uint64_t>& d_blocks, uint64_t tokens, uint64_t first = 0) {
  uint64_t bad = 0;
  for (auto& w : pd.d) {
    for (uint32_t layer = 0; layer < w->layout.num_layers; ++layer) bad += Check(*w, req, layer, d_blocks, tokens, first);
  }
  return bad;
}

TEST_P(ConnectorTest, WriteModeMovesEveryLayer) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst);
  const auto p_blocks = Blocks({3, 4, 9}), d_blocks = Blocks({10, 2, 7});
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("r1", "prefill", 0, d_blocks, 40).ok());
  SaveAll(pd, "r1", 1, p_blocks, 40);
  ExpectDone(*pd.d[0], "r1");
  ExpectDone(*pd.p[0], "r1");
  EXPECT_EQ(CheckAll(pd, 1, d_blocks, 40), 0u);
  EXPECT_EQ(pd.p[0]->conn->stats().layers_written, 3u);
  EXPECT_EQ(pd.p[0]->conn->pending(), 0u);
  EXPECT_EQ(pd.d[0]->conn->pending(), 0u);
}

TEST_P(ConnectorTest, EagerConnectReachesThePeerBeforeTheFirstRequest) {
  ConnectorOptions o;
  o.eager_connect = true;
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kSeparate, o);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (pd.d[0]->conn->stats().messages_received == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GE(pd.p[0]->conn->stats().messages_sent, 1u);
  EXPECT_GE(pd.d[0]->conn->stats().messages_received, 1u);  // the producer's first message
  const auto pb = Blocks({1}), db = Blocks({2});
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("e", "prefill", 0, db).ok());
  SaveAll(pd, "e", 4, pb, 16);
  ExpectDone(*pd.d[0], "e");
  ExpectDone(*pd.p[0], "e");
  EXPECT_EQ(CheckAll(pd, 4, db, 16), 0u);
}

TEST_P(ConnectorTest, LayersSavedBeforeTheAllocationAreDeferredThenSent) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kBlocksFirst, TensorOrder::kKvFirstHnd);
  const auto p_blocks = Blocks({0, 1}), d_blocks = Blocks({5, 6});
  SaveAll(pd, "r", 7, p_blocks, 32);
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("r", "prefill", 0, d_blocks).ok());
  ExpectDone(*pd.d[0], "r");
  ExpectDone(*pd.p[0], "r");
  EXPECT_EQ(CheckAll(pd, 7, d_blocks, 32), 0u);
  EXPECT_GE(pd.p[0]->conn->stats().layers_deferred, 1u);
}

TEST_P(ConnectorTest, HeterogeneousTpBothWaysWithDifferentBlockSizes) {
  for (auto [p_tp, d_tp] : {std::pair{2u, 1u}, std::pair{1u, 2u}, std::pair{4u, 2u}, std::pair{2u, 4u}}) {
    SCOPED_TRACE(std::to_string(p_tp) + "->" + std::to_string(d_tp));
    Pd pd = MakePd(transport(), p_tp, d_tp, TensorOrder::kKvFirstHnd, TensorOrder::kBlocksFirst, {}, 16, 32);
    const auto p_blocks = Blocks({8, 9, 1, 2, 30}), d_blocks = Blocks({4, 0, 11});
    for (auto& w : pd.d) ASSERT_TRUE(w->conn->ExpectWrite("h", "prefill", 0, d_blocks, 70).ok());
    SaveAll(pd, "h", 3, p_blocks, 70);
    for (auto& w : pd.d) ExpectDone(*w, "h");
    for (auto& w : pd.p) ExpectDone(*w, "h");
    EXPECT_EQ(CheckAll(pd, 3, d_blocks, 70), 0u);
  }
}

TEST_P(ConnectorTest, MlaReplicatedLatentIsWrittenOncePerConsumerRank) {
  Pd pd = MakePd(transport(), 2, 1, TensorOrder::kMla, TensorOrder::kMla, {}, 16, 16, true);
  const auto p_blocks = Blocks({1, 2}), d_blocks = Blocks({3, 4});
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("m", "prefill", 0, d_blocks).ok());
  SaveAll(pd, "m", 11, p_blocks, 32);
  ExpectDone(*pd.d[0], "m");
  for (auto& w : pd.p) ExpectDone(*w, "m");  // the rank that writes nothing still ends
  EXPECT_EQ(CheckAll(pd, 11, d_blocks, 32), 0u);
  EXPECT_EQ(pd.p[0]->conn->stats().bytes + pd.p[1]->conn->stats().bytes,
            3ull * 32 * pd.d[0]->layout.head_bytes());
}

TEST_P(ConnectorTest, PrefixHitMovesOnlyTheSuffixAndAFullHitMovesNothing) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst);
  const auto p_blocks = Blocks({1, 2, 3, 4});
  const auto d_blocks = Blocks({20, 21});  // tokens 32..63
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("s", "prefill", 0, d_blocks, 32, 32).ok());
  SaveAll(pd, "s", 5, p_blocks, 64);
  ExpectDone(*pd.d[0], "s");
  ExpectDone(*pd.p[0], "s");
  EXPECT_EQ(CheckAll(pd, 5, d_blocks, 32, 32), 0u);
  const uint64_t before = pd.p[0]->conn->stats().bytes;
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("full", "prefill", 0, {}, 0, 64).ok());
  SaveAll(pd, "full", 6, p_blocks, 64);
  ExpectDone(*pd.d[0], "full");
  ExpectDone(*pd.p[0], "full");
  EXPECT_EQ(pd.p[0]->conn->stats().bytes, before);
}

TEST_P(ConnectorTest, ReadModeWaitsLayerByLayerThenReleases) {
  ConnectorOptions o;
  o.mode = Mode::kRead;
  for (auto [p_tp, d_tp] : {std::pair{1u, 1u}, std::pair{2u, 1u}, std::pair{1u, 2u}}) {
    SCOPED_TRACE(std::to_string(p_tp) + "->" + std::to_string(d_tp));
    Pd pd = MakePd(transport(), p_tp, d_tp, TensorOrder::kSeparate, TensorOrder::kKvFirst, o);
    const auto p_blocks = Blocks({5, 6, 7}), d_blocks = Blocks({0, 9, 3});
    ReadParams params;
    for (auto& w : pd.p) {
      for (uint32_t l = 0; l < 3; ++l) Fill(*w, 9, l, p_blocks, 48);
      auto held = w->conn->HoldForRead("rd", p_blocks, 48);
      ASSERT_TRUE(held.ok()) << held.status().ToString();
      if (w->layout.tp_rank == 0) params = *held;
    }
    auto carried = ReadParams::Unpack(params.Pack());  // through the router
    ASSERT_TRUE(carried.ok());
    for (auto& w : pd.d) ASSERT_TRUE(w->conn->StartRead(*carried, d_blocks).ok());
    for (auto& w : pd.d) {
      for (uint32_t l = 0; l < 3; ++l) {
        ASSERT_TRUE(w->conn->WaitLayer("rd", l, 5s).ok());
        EXPECT_EQ(Check(*w, 9, l, d_blocks, 48), 0u) << "layer " << l;
      }
    }
    for (auto& w : pd.d) ExpectDone(*w, "rd");
    for (auto& w : pd.p) ExpectDone(*w, "rd");
    EXPECT_EQ(pd.d[0]->conn->WaitLayer("rd", 0, 1ms).code(), Code::kNotFound);
  }
}

TEST_P(ConnectorTest, ManyInterleavedRequestsAllCompleteWithEveryByte) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kBlocksFirst, TensorOrder::kKvFirst);
  std::mt19937_64 rng(42);
  const int kRequests = 1024, kWindow = 16;
  const uint32_t layers = pd.p[0]->layout.num_layers;
  uint64_t bad = 0;
  for (int base = 0; base < kRequests; base += kWindow) {
    // A window of requests, each with 1..2 blocks on each side (disjoint), whose allocation
    // lands at a random point among its layer saves.
    struct R { std::string id; std::vector<uint64_t> pb, db; uint32_t alloc_at; uint64_t tokens; };
    std::vector<R> rs;
    for (int i = 0; i < kWindow; ++i) {
      R r;
      r.id = "q" + std::to_string(base + i);
      const uint64_t n = 1 + rng() % 2;
      for (uint64_t b = 0; b < n; ++b) {
        r.pb.push_back(uint64_t(i) * 2 + b);
        r.db.push_back(63 - uint64_t(i) * 2 - b);
      }
      r.tokens = (n - 1) * 16 + 1 + rng() % 16;
      r.alloc_at = rng() % (layers + 2);
      rs.push_back(std::move(r));
    }
    for (uint32_t step = 0; step <= layers + 1; ++step) {
      for (auto& r : rs) {
        if (step == r.alloc_at) {
          ASSERT_TRUE(pd.d[0]->conn->ExpectWrite(r.id, "prefill", 0, r.db, r.tokens).ok());
        }
        if (step < layers) {
          Fill(*pd.p[0], base + (&r - rs.data()), step, r.pb, r.tokens);
          ASSERT_TRUE(pd.p[0]->conn->SaveLayer(r.id, step, r.pb).ok());
        } else if (step == layers) {
          ASSERT_TRUE(pd.p[0]->conn->Seal(r.id, layers).ok());
        }
      }
    }
    auto d = Collect(*pd.d[0], kWindow);
    auto p = Collect(*pd.p[0], kWindow);
    ASSERT_EQ(d.size(), size_t(kWindow));
    ASSERT_EQ(p.size(), size_t(kWindow));
    for (auto& f : d) ASSERT_EQ(f.outcome, Outcome::kDone) << f.request << ": " << f.status.ToString();
    for (auto& f : p) ASSERT_EQ(f.outcome, Outcome::kDone) << f.request << ": " << f.status.ToString();
    for (size_t i = 0; i < rs.size(); ++i) {
      for (uint32_t l = 0; l < layers; ++l) bad += Check(*pd.d[0], base + i, l, rs[i].db, rs[i].tokens);
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(pd.d[0]->conn->stats().requests_done, uint64_t(kRequests));
}

TEST_P(ConnectorTest, AnAllocationThatNeverComesFailsTheProducerAfterTheDeferredTimeout) {
  ConnectorOptions o;
  o.deferred_write_timeout = 200ms;
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst, o);
  const auto start = std::chrono::steady_clock::now();
  SaveAll(pd, "lost", 1, Blocks({1}), 16);
  auto f = Collect(*pd.p[0], 1, 5s);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].outcome, Outcome::kFailed);
  EXPECT_EQ(f[0].status.code(), Code::kDeadlineExceeded) << f[0].status.ToString();
  EXPECT_EQ(f[0].blocks, Blocks({1}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  // A save or seal that comes after the end is refused: the request ended once, and its caller
  // hears that nothing more of it will be reported.
  EXPECT_EQ(pd.p[0]->conn->SaveLayer("lost", 0, Blocks({1})).code(), Code::kFailedPrecondition);
  EXPECT_EQ(pd.p[0]->conn->Seal("lost", 1).code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Collect(*pd.p[0], 1, 300ms).empty());
  EXPECT_EQ(pd.p[0]->conn->pending(), 0u);
}

TEST_P(ConnectorTest, DataThatNeverCompletesFailsTheConsumerWithItsBlocksAfterTheProducerConfirms) {
  ConnectorOptions o;
  o.transfer_timeout = 200ms;
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst, o);
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("slow", "prefill", 0, Blocks({4, 5}), 32).ok());
  // The producer saves a layer but never seals.
  Fill(*pd.p[0], 1, 0, Blocks({1, 2}), 32);
  ASSERT_TRUE(pd.p[0]->conn->SaveLayer("slow", 0, Blocks({1, 2})).ok());
  auto d = Collect(*pd.d[0], 1, 5s);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].outcome, Outcome::kFailed);
  EXPECT_EQ(d[0].status.code(), Code::kDeadlineExceeded) << d[0].status.ToString();
  EXPECT_EQ(d[0].blocks, Blocks({4, 5}));  // for recompute
  auto p = Collect(*pd.p[0], 1, 5s);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].outcome, Outcome::kAborted);
  EXPECT_EQ(pd.d[0]->conn->stats().blocks_expired, 0u);  // confirmed, not expired
}

TEST_P(ConnectorTest, NoByteLandsInAConsumerBlockAfterItsAbortEnded) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst);
  const auto p_blocks = Blocks({1, 2}), d_blocks = Blocks({8, 9});
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("ab", "prefill", 0, d_blocks, 32).ok());
  Fill(*pd.p[0], 2, 0, p_blocks, 32);
  ASSERT_TRUE(pd.p[0]->conn->SaveLayer("ab", 0, p_blocks).ok());
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(pd.d[0]->conn->Abort("ab").ok());
  auto d = Collect(*pd.d[0], 1, 5s);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].outcome, Outcome::kAborted);
  // The blocks are the caller's again: it reuses them; the producer's later saves must not land.
  for (auto& w : pd.d) {
    for (const auto& b : w->buffers) std::memset(b.data(), 0x5a, b.size());
  }
  // Taken while the abort is on its way to the producer, refused once the producer ended "ab".
  auto taken_or_refused = [](const Status& s) { return s.ok() || s.code() == Code::kFailedPrecondition; };
  for (uint32_t l = 1; l < 3; ++l) {
    Fill(*pd.p[0], 2, l, p_blocks, 32);
    Status s = pd.p[0]->conn->SaveLayer("ab", l, p_blocks);
    EXPECT_TRUE(taken_or_refused(s)) << s.ToString();
  }
  Status sealed = pd.p[0]->conn->Seal("ab", 3);
  EXPECT_TRUE(taken_or_refused(sealed)) << sealed.ToString();
  auto p = Collect(*pd.p[0], 1, 5s);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].outcome, Outcome::kAborted) << p[0].status.ToString();
  std::this_thread::sleep_for(50ms);
  for (auto& w : pd.d) {
    for (const auto& b : w->buffers) {
      for (uint64_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], std::byte{0x5a}) << "byte " << i;
    }
  }
}

TEST_P(ConnectorTest, AConsumerWhoseProducerIsGoneEndsWithoutWaitingForTheAbortTimeout) {
  ConnectorOptions o;
  o.transfer_timeout = 300ms;
  o.liveness_interval = 50ms;
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst, o);
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("g", "prefill", 0, Blocks({1}), 16).ok());
  std::this_thread::sleep_for(20ms);
  pd.p[0].reset();  // the producer's engine and connector are gone
  const auto start = std::chrono::steady_clock::now();
  auto d = Collect(*pd.d[0], 1, 10s);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].outcome, Outcome::kFailed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// Shared-memory rings mapped in this process (both ends of every shm connection map one).
size_t MappedRings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("ferry-shm-ring") != std::string::npos;
  return n;
}

// A consumer whose process restarts comes back under the same worker name as another engine.
// The producer drops its sessions to the old engine, and its engine the old engine's dead
// connection: over shm each restart used to leave a ring mapped for the producer's life.
TEST_P(ConnectorTest, AConsumerThatRestartsLeavesNoConnectionOfItsOldEngineBehind) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst);
  const auto p_blocks = Blocks({3}), d_blocks = Blocks({5});
  ConnectorOptions d_options;
  d_options.busy_poll = transport().ends_with(kBusy);
  size_t rings = 0;
  for (int k = 0; k < 4; ++k) {
    const std::string id = "restart" + std::to_string(k);
    ASSERT_TRUE(pd.d[0]->conn->ExpectWrite(id, "prefill", 0, d_blocks, 16).ok());
    SaveAll(pd, id, 10 + k, p_blocks, 16);
    ExpectDone(*pd.d[0], id);
    ExpectDone(*pd.p[0], id);
    EXPECT_EQ(CheckAll(pd, 10 + k, d_blocks, 16), 0u) << "after " << k << " restarts";
    if (k == 0) rings = MappedRings();
    pd.d[0].reset();
    pd.d[0] = MakeWorker(BaseTransport(transport()), "decode", Identity(0, 1), TensorOrder::kKvFirst, d_options);
    ASSERT_NE(pd.d[0], nullptr);
    Introduce(pd.all());
  }
  // The producer still serves the consumer it has now ...
  ASSERT_TRUE(pd.d[0]->conn->ExpectWrite("after", "prefill", 0, d_blocks, 16).ok());
  SaveAll(pd, "after", 20, p_blocks, 16);
  ExpectDone(*pd.d[0], "after");
  ExpectDone(*pd.p[0], "after");
  EXPECT_EQ(CheckAll(pd, 20, d_blocks, 16), 0u);
  // ... and keeps none of the old engines' connections: as many shm rings as with the first
  // consumer after its first request.
  if (BaseTransport(transport()) == "shm") {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (MappedRings() > rings && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    EXPECT_LE(MappedRings(), rings);
    EXPECT_GT(rings, 0u) << "no shm ring was mapped: the test counts nothing";
  }
}

TEST_P(ConnectorTest, BadCallsAreRefusedWithClearErrors) {
  Pd pd = MakePd(transport(), 1, 1, TensorOrder::kKvFirst, TensorOrder::kKvFirst);
  Connector& d = *pd.d[0]->conn;
  EXPECT_EQ(d.ExpectWrite("", "prefill", 0, Blocks({1})).code(), Code::kInvalidArgument);
  EXPECT_EQ(d.ExpectWrite("x", "prefill", 0, Blocks({64})).code(), Code::kOutOfRange);
  EXPECT_EQ(d.ExpectWrite("x", "nobody", 0, Blocks({1})).code(), Code::kFailedPrecondition);
  EXPECT_EQ(d.ExpectWrite("x", "prefill", 0, Blocks({1}), 17).code(), Code::kOutOfRange);
  ASSERT_TRUE(d.ExpectWrite("x", "prefill", 0, Blocks({1})).ok());
  EXPECT_EQ(d.ExpectWrite("x", "prefill", 0, Blocks({1})).code(), Code::kAlreadyExists);
  EXPECT_EQ(d.StartRead(ReadParams{}, Blocks({1})).code(), Code::kInvalidArgument);
  EXPECT_EQ(d.Abort("never").code(), Code::kNotFound);
  EXPECT_EQ(pd.p[0]->conn->SaveLayer("y", 3, Blocks({1})).code(), Code::kOutOfRange);
  EXPECT_EQ(pd.p[0]->conn->HoldForRead("y", Blocks({1})).status().code(), Code::kFailedPrecondition);
  // A peer whose model differs is refused naming the field.
  auto other = MakeWorker(BaseTransport(transport()), "other", [] { auto l = Identity(0, 1); l.head_dim = 16; return l; }(),
                          TensorOrder::kKvFirst);
  ASSERT_NE(other, nullptr);
  Status s = d.AddPeer(other->conn->Metadata());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.ToString().find("head_dim"), std::string::npos) << s.ToString();
  ASSERT_TRUE(d.Abort("x").ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectorTest, ::testing::Values("local", "shm", "shm_busy_poll"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::kv::testing

namespace ferry::kv::testing {
namespace {

TEST(ConnectorChecksumTest, EveryLayerIsCheckedAndACorruptedBlockFailsTheRequest) {
  ConnectorOptions o;
  o.checksums = true;
  auto p = MakeWorker("local", "prefill", Identity(0, 1), TensorOrder::kBlocksFirst, o);
  auto d = MakeWorker("local", "decode", Identity(0, 1), TensorOrder::kKvFirstHnd, o);
  ASSERT_TRUE(p && d);
  Introduce({p.get(), d.get()});
  const auto pb = Blocks({1, 2}), db = Blocks({6, 3});
  auto run = [&](const std::string& id, uint64_t req, bool corrupt) {
    ASSERT_TRUE(d->conn->ExpectWrite(id, "prefill", 0, db, 30).ok());
    for (uint32_t l = 0; l < 3; ++l) {
      Fill(*p, req, l, pb, 30);
      ASSERT_TRUE(p->conn->SaveLayer(id, l, pb).ok());
    }
    if (corrupt) {
      // Wait until the last layer landed, then change one byte of it behind the connector's
      // back (a stale writer), before the completion is sent.
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (p->conn->stats().layers_written < 6 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      ASSERT_EQ(Check(*d, req, 2, db, 30), 0u);
      *Locate(*d, db, 17, 2, 1, 2) ^= std::byte{1};
    }
    ASSERT_TRUE(p->conn->Seal(id, 3).ok());
  };
  run("good", 1, false);
  auto ok = Collect(*d, 1);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].outcome, Outcome::kDone) << ok[0].status.ToString();
  ASSERT_EQ(Collect(*p, 1).size(), 1u);  // its writes' ends are counted before it ends
  ASSERT_EQ(p->conn->stats().layers_written, 3u);
  run("bad", 2, true);
  auto bad = Collect(*d, 1);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].outcome, Outcome::kFailed);
  EXPECT_EQ(bad[0].status.code(), Code::kDataLoss) << bad[0].status.ToString();
  EXPECT_NE(bad[0].status.ToString().find("layer 2"), std::string::npos) << bad[0].status.ToString();
  EXPECT_EQ(d->conn->stats().checksum_failures, 1u);
  EXPECT_EQ(Collect(*p, 1).size(), 1u);
  // A hybrid model saves fewer layers than it has (here 0 and 2): those are checked.
  ASSERT_TRUE(d->conn->ExpectWrite("hybrid", "prefill", 0, db, 30).ok());
  for (uint32_t l : {0u, 2u}) {
    Fill(*p, 3, l, pb, 30);
    ASSERT_TRUE(p->conn->SaveLayer("hybrid", l, pb).ok());
  }
  ASSERT_TRUE(p->conn->Seal("hybrid", 2).ok());
  auto hybrid = Collect(*d, 1);
  ASSERT_EQ(hybrid.size(), 1u);
  EXPECT_EQ(hybrid[0].outcome, Outcome::kDone) << hybrid[0].status.ToString();
  EXPECT_EQ(Check(*d, 3, 0, db, 30) + Check(*d, 3, 2, db, 30), 0u);
  EXPECT_EQ(Collect(*p, 1).size(), 1u);
}

}  // namespace
}  // namespace ferry::kv::testing
