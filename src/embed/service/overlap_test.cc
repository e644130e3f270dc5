// The layers of a step overlap (host mode through the copy pump, pump_host_copies: the path
// CUDA outputs take): every row of multi-layer steps is right on every rank, each layer's DONE
// is set in layer order and only after its rows, and a step that stops with a layer still in
// the pump (a rank that does not release, a rank that dies, the service stopping) fails the
// rest of its layers and leaves nothing waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "embed/service/host_flag.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

ServerOptions PumpOptions(const std::string& path) {
  ServerOptions o = SmallServerOptions(path);
  o.pump_host_copies = true;
  o.min_copy_bytes = 4 * kTokenBytes;  // several copies per layer
  return o;
}

// Rank 1 of 2 of group `dp` over a raw connection (host mode): the test sets its flags.
struct RawRankOne {
  Register reg;
  std::unique_ptr<SharedMemory> out;
  UniqueFd fd;
  uint32_t* flag(size_t slot) {
    return reinterpret_cast<uint32_t*>(out->data() + reg.layers[slot].flag_offset);
  }
  const uint8_t* output(size_t slot) { return out->data() + reg.layers[slot].output_offset; }
};

std::unique_ptr<RawRankOne> RegisterRankOne(const std::string& path, uint32_t dp) {
  auto r = std::make_unique<RawRankOne>();
  Result<std::unique_ptr<SharedMemory>> out =
      SharedMemory::Create("raw-out", 3 * 512 * kTokenBytes + 4096);
  if (!out.ok()) return nullptr;
  r->out = std::move(out).value();
  r->reg = SmallRegister(dp, 1, 2);
  Result<UniqueFd> fd = ConnectTo(path);
  if (!fd.ok()) return nullptr;
  r->fd = std::move(fd).value();
  int fds[] = {r->out->fd()};
  if (!Send(r->fd.get(), Encode(r->reg), fds).ok()) return nullptr;
  Result<AnyMessage> m = NextMessage(r->fd.get());
  if (!m.ok() || !std::holds_alternative<Registered>(*m) || !std::get<Registered>(*m).status.ok())
    return nullptr;
  return r;
}

// Waits up to 5 s for `pred`.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

class EmbedOverlapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempSocketPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void Start(ServerOptions o) {
    server_ = StartServer(o);
    ASSERT_TRUE(server_);
  }
  std::string path_;
  std::unique_ptr<Server> server_;
};

TEST_F(EmbedOverlapTest, EveryRowOfMultiLayerStepsOnEveryRank) {
  Start(PumpOptions(path_));
  auto r0 = MakeClient(path_, 0, 0, 2), r1 = MakeClient(path_, 0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  // Sizes around the chunk (16 tokens) and the copy minimum (4 tokens), and full capacity.
  const uint32_t tokens[] = {512, 1, 17, 300, 16, 64, 511, 5};
  for (uint32_t i = 0; i < 8; ++i)
    Forward({r0.get(), r1.get()}, MakeStep(1 + i % 4, tokens[i], 10 + i));
  // The counters follow the last DONE.
  EXPECT_TRUE(Eventually([&] { return server_->stats().steps_ok == 8; }));
  EXPECT_EQ(server_->stats().steps_failed, 0u);
}

TEST_F(EmbedOverlapTest, DoneInLayerOrderAndOnlyAfterTheRows) {
  Start(PumpOptions(path_));
  auto r0 = MakeClient(path_, 0, 0, 2), r1 = MakeClient(path_, 0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  for (uint32_t round = 0; round < 20; ++round) {
    StepData s = MakeStep(4, 512 - round * 7, 100 + round);
    WriteInputs(*r0, s);
    for (Client* c : {r0.get(), r1.get()})
      ASSERT_TRUE(c->PrepareForward(4, s.tokens.size(), false).ok());
    // Flags read last layer first: a layer seen DONE must have every earlier layer DONE when
    // read afterwards, and its rows in place the moment its DONE is seen.
    std::vector<bool> seen(3, false);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!seen[2]) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "the step did not finish";
      for (Client* c : {r0.get(), r1.get()}) {
        uint32_t f[3];
        for (int slot = 2; slot >= 0; --slot) f[slot] = c->flag(slot);
        for (int slot = 2; slot >= 1; --slot)
          if (f[slot] == kFlagDone) {
            ASSERT_EQ(f[slot - 1], kFlagDone) << "slot " << slot;
          }
      }
      for (size_t slot = 0; slot < 3; ++slot) {
        if (seen[slot] || r1->flag(slot) != kFlagDone || r0->flag(slot) != kFlagDone) continue;
        seen[slot] = true;
        ExpectRows(*r0, slot, s);
        ExpectRows(*r1, slot, s);
      }
    }
    for (Client* c : {r0.get(), r1.get()})
      for (size_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(c->Wait(slot).ok());
    for (Client* c : {r0.get(), r1.get()}) ASSERT_TRUE(c->ReleaseOutputs().ok());
  }
  EXPECT_TRUE(Eventually([&] { return server_->stats().steps_ok == 20; }));
}

// A layer waits for rank 1 to release its output while the layer before it is in the pump:
// that layer still gets its DONE and rows; then rank 1 dies and the rest of the step fails on
// rank 0 at once (no wait for the deadline), and the group serves the next step.
TEST_F(EmbedOverlapTest, RankDyingMidStepFailsTheRestAndLeavesNothingWaiting) {
  ServerOptions o = PumpOptions(path_);
  o.wait_timeout = std::chrono::seconds(20);
  Start(o);
  auto r0 = MakeClient(path_, 0, 0, 2);
  auto raw1 = RegisterRankOne(path_, 0);
  ASSERT_TRUE(r0 && raw1);
  StepData s1 = MakeStep(2, 300, 1);
  WriteInputs(*r0, s1);
  ASSERT_TRUE(r0->PrepareForward(2, 300, false).ok());
  for (size_t slot = 0; slot < 3; ++slot) {
    ASSERT_TRUE(r0->Wait(slot).ok());
    ExpectRows(*r0, slot, s1);
    ASSERT_TRUE(Eventually([&] { return LoadFlag(raw1->flag(slot)) == kFlagDone; }));
    ExpectRowsAt(raw1->output(slot), slot, s1);
  }
  ASSERT_TRUE(r0->ReleaseOutputs().ok());
  StoreFlag(raw1->flag(0), kFlagReset);  // rank 1 releases layer 0 only
  StepData s2 = MakeStep(3, 200, 2);
  WriteInputs(*r0, s2);
  ASSERT_TRUE(r0->PrepareForward(3, 200, false).ok());
  ASSERT_TRUE(r0->Wait(0).ok());
  ExpectRows(*r0, 0, s2);
  ASSERT_TRUE(Eventually([&] { return LoadFlag(raw1->flag(0)) == kFlagDone; }));
  ExpectRowsAt(raw1->output(0), 0, s2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(r0->flag(1), kFlagReset) << "layer 1 must wait for rank 1's release";
  const auto died = std::chrono::steady_clock::now();
  raw1->fd.reset();  // rank 1 dies
  for (size_t slot = 1; slot < 3; ++slot) {
    (void)r0->Wait(slot);
    EXPECT_EQ(r0->flag(slot), kFlagFailed) << "slot " << slot;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - died, std::chrono::seconds(5));
  EXPECT_TRUE(Eventually([&] { return server_->stats().steps_failed == 1; }));
  // A new rank 1 registers; the group serves the next step in full.
  (void)r0->ReleaseOutputs();
  auto r1 = MakeClient(path_, 0, 1, 2);
  ASSERT_TRUE(r1);
  // The failed step's reply may be reported by rank 0's next call: a dummy forward takes it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (void)r0->PrepareForward(1, 8, true);
  (void)r0->ReleaseOutputs();
  Forward({r0.get(), r1.get()}, MakeStep(2, 64, 3));
  EXPECT_TRUE(Eventually([&] { return server_->stats().steps_ok == 2; }));
}

// A rank that never releases layer 1: the step fails at the deadline, layer 0 (already in the
// pump) keeps its DONE, layers 1 and 2 are FAILED on rank 0.
TEST_F(EmbedOverlapTest, ReleaseDeadlineMidStepFailsTheRest) {
  ServerOptions o = PumpOptions(path_);
  o.wait_timeout = std::chrono::milliseconds(300);
  Start(o);
  auto r0 = MakeClient(path_, 0, 0, 2);
  auto raw1 = RegisterRankOne(path_, 0);
  ASSERT_TRUE(r0 && raw1);
  StepData s1 = MakeStep(2, 100, 4);
  WriteInputs(*r0, s1);
  ASSERT_TRUE(r0->PrepareForward(2, 100, false).ok());
  for (size_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(r0->Wait(slot).ok());
  ASSERT_TRUE(r0->ReleaseOutputs().ok());
  ASSERT_TRUE(Eventually([&] { return LoadFlag(raw1->flag(2)) == kFlagDone; }));
  StoreFlag(raw1->flag(0), kFlagReset);
  StepData s2 = MakeStep(2, 100, 5);
  WriteInputs(*r0, s2);
  ASSERT_TRUE(r0->PrepareForward(2, 100, false).ok());
  ASSERT_TRUE(r0->Wait(0).ok());
  EXPECT_EQ(r0->flag(0), kFlagDone);
  ExpectRows(*r0, 0, s2);
  for (size_t slot = 1; slot < 3; ++slot) {
    (void)r0->Wait(slot);
    EXPECT_EQ(r0->flag(slot), kFlagFailed) << "slot " << slot;
  }
  EXPECT_TRUE(Eventually([&] { return server_->stats().steps_failed == 1; }));
}

// The service stops while a step waits with a layer in the pump: Stop returns promptly and the
// step's remaining layers are FAILED.
TEST_F(EmbedOverlapTest, StopMidStepLeavesNothingWaiting) {
  ServerOptions o = PumpOptions(path_);
  o.wait_timeout = std::chrono::seconds(20);
  Start(o);
  auto r0 = MakeClient(path_, 0, 0, 2);
  auto raw1 = RegisterRankOne(path_, 0);
  ASSERT_TRUE(r0 && raw1);
  StepData s1 = MakeStep(2, 100, 6);
  WriteInputs(*r0, s1);
  ASSERT_TRUE(r0->PrepareForward(2, 100, false).ok());
  for (size_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(r0->Wait(slot).ok());
  ASSERT_TRUE(r0->ReleaseOutputs().ok());
  ASSERT_TRUE(Eventually([&] { return LoadFlag(raw1->flag(2)) == kFlagDone; }));
  StoreFlag(raw1->flag(0), kFlagReset);
  ASSERT_TRUE(r0->PrepareForward(2, 100, false).ok());
  ASSERT_TRUE(r0->Wait(0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  for (size_t slot = 1; slot < 3; ++slot) EXPECT_EQ(r0->flag(slot), kFlagFailed) << slot;
}

TEST(EmbedOverlapOptions, PumpCpusOutOfRangeIsInvalidArgument) {
  ServerOptions o = SmallServerOptions("/tmp/unused.sock");
  o.pump_cpus = -2;
  EXPECT_EQ(ValidateServerOptions(o).code(), Code::kInvalidArgument);
  o.pump_cpus = kMaxPumpCpus + 1;
  EXPECT_EQ(ValidateServerOptions(o).code(), Code::kInvalidArgument);
  o.pump_cpus = 0;
  EXPECT_TRUE(ValidateServerOptions(o).ok());
}

}  // namespace
}  // namespace ferry::embed::service
