// The service in a thread: registration, steps for two data-parallel x two tensor-parallel
// ranks checked byte for byte, flag semantics, bad requests and registrations, client loss.
#include <gtest/gtest.h>

#include <thread>

#include "embed/service/host_flag.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

using EmbedServiceTest = SmallServiceTest;

TEST_F(EmbedServiceTest, TwoDataParallelByTwoTensorParallelRanks) {
  auto a0 = MakeClient(0, 0, 2), a1 = MakeClient(0, 1, 2);
  auto b0 = MakeClient(1, 0, 2), b1 = MakeClient(1, 1, 2);
  ASSERT_TRUE(a0 && a1 && b0 && b1);
  EXPECT_EQ(server_->stats().live_clients, 4u);
  // Both data-parallel ranks step at the same time, prefill-like then decode-like.
  auto run = [&](Client* r0, Client* r1, uint32_t seed) {
    Forward({r0, r1}, MakeStep(4, 512, seed));
    Forward({r0, r1}, MakeStep(64, 64, seed + 1));
    Forward({r0, r1}, MakeStep(3, 100, seed + 2));
  };
  std::thread other([&] { run(b0.get(), b1.get(), 100); });
  run(a0.get(), a1.get(), 1);
  other.join();
  const auto stats = StatsAfter(*server_, 6);
  EXPECT_EQ(stats.steps_ok, 6u);
  EXPECT_EQ(stats.steps_failed, 0u);
}

TEST_F(EmbedServiceTest, ServiceWaitsForReleaseBeforeOverwriting) {
  auto r0 = MakeClient(0, 0, 2), r1 = MakeClient(0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  StepData s1 = MakeStep(2, 40, 5);
  WriteInputs(*r0, s1);
  ASSERT_TRUE(r0->PrepareForward(2, 40, false).ok());
  for (Client* c : {r0.get(), r1.get()})
    for (size_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(c->Wait(slot).ok());
  // Rank 1 does not release: the next step must not touch its outputs.
  ASSERT_TRUE(r0->ReleaseOutputs().ok());
  StepData s2 = MakeStep(2, 40, 6);
  WriteInputs(*r0, s2);
  ASSERT_TRUE(r0->PrepareForward(2, 40, false).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (size_t slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(r1->flag(slot), kFlagDone);
    EXPECT_EQ(r0->flag(slot), kFlagReset);
    ExpectRows(*r1, slot, s1);
  }
  ASSERT_TRUE(r1->ReleaseOutputs().ok());
  for (Client* c : {r0.get(), r1.get()})
    for (size_t slot = 0; slot < 3; ++slot) {
      ASSERT_TRUE(c->Wait(slot).ok());
      ExpectRows(*c, slot, s2);
    }
}

// Issue 10: a forward prepared before the previous one was released is refused (its waits would
// pass on the previous DONE flags and read the previous rows); nothing is sent.
TEST_F(EmbedServiceTest, PrepareBeforeReleaseIsFailedPrecondition) {
  auto c = MakeClient(0, 0, 1);
  ASSERT_TRUE(c);
  StepData s1 = MakeStep(2, 40, 5);
  WriteInputs(*c, s1);
  ASSERT_TRUE(c->PrepareForward(2, 40, false).ok());
  for (size_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(c->Wait(slot).ok());
  StepData s2 = MakeStep(2, 40, 6);
  WriteInputs(*c, s2);
  EXPECT_EQ(c->PrepareForward(2, 40, false).code(), Code::kFailedPrecondition);
  EXPECT_EQ(c->PrepareForward(2, 40, true).code(), Code::kFailedPrecondition);
  for (size_t slot = 0; slot < 3; ++slot) ExpectRows(*c, slot, s1);
  ASSERT_TRUE(c->ReleaseOutputs().ok());
  ASSERT_TRUE(c->PrepareForward(2, 40, false).ok());
  for (size_t slot = 0; slot < 3; ++slot) {
    ASSERT_TRUE(c->Wait(slot).ok());
    ExpectRows(*c, slot, s2);
  }
  ASSERT_TRUE(c->ReleaseOutputs().ok());
  EXPECT_EQ(StatsAfter(*server_, 2).steps_ok, 2u);
}

// Issue 9: a step over the registered capacity is refused by the client, before anything is
// sent, and the client goes on (it used to get a reply under seq 0 and time out later).
TEST_F(EmbedServiceTest, OverCapacityStepIsRefusedByTheClient) {
  auto c = MakeClient(0, 0, 1);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->PrepareForward(2, 1u << 21, false).code(), Code::kOutOfRange);
  EXPECT_EQ(c->PrepareForward(2, 513, false).code(), Code::kOutOfRange);
  EXPECT_EQ(c->PrepareForward(65, 128, false).code(), Code::kOutOfRange);
  for (size_t slot = 0; slot < 3; ++slot) EXPECT_EQ(c->flag(slot), kFlagReset);
  Forward({c.get()}, MakeStep(4, 128, 7));
  Forward({c.get()}, MakeStep(2, 16, 8));
  const auto stats = StatsAfter(*server_, 2);
  EXPECT_EQ(stats.steps_ok, 2u);
  EXPECT_EQ(stats.steps_failed, 0u);
}

// Issue 15: a step of no tokens is served (DONE on every layer) and copies nothing.
TEST_F(EmbedServiceTest, EmptyStepIsServed) {
  auto r0 = MakeClient(0, 0, 2), r1 = MakeClient(0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  StepData empty;
  empty.qsl = {0, 0};
  empty.ctx = {5, 6};
  Forward({r0.get(), r1.get()}, empty);
  empty.qsl = {0};
  empty.ctx.clear();
  Forward({r0.get(), r1.get()}, empty);  // no requests either
  const auto stats = StatsAfter(*server_, 2);
  EXPECT_EQ(stats.steps_ok, 2u);
  EXPECT_EQ(stats.steps_failed, 0u);
}

TEST_F(EmbedServiceTest, DummyForwardSatisfiesWaitsLocally) {
  auto c = MakeClient(0, 0, 1);
  ASSERT_TRUE(c);
  std::memset(c->output(1).data(), 0xab, 64 * kTokenBytes);
  ASSERT_TRUE(c->PrepareForward(1, 64, true).ok());
  for (size_t slot = 0; slot < 3; ++slot) {
    ASSERT_TRUE(c->Wait(slot).ok());
    EXPECT_EQ(c->flag(slot), kFlagDone);
  }
  for (size_t i = 0; i < 64 * kTokenBytes; ++i) ASSERT_EQ(c->output(1)[i], 0) << i;
  ASSERT_TRUE(c->ReleaseOutputs().ok());
  EXPECT_EQ(c->flag(0), kFlagReset);
  EXPECT_EQ(server_->stats().steps_ok + server_->stats().steps_failed, 0u);
}

// A bad step: every flag FAILED (no wait blocks), the exact error on rank 0, kAborted on the
// other rank, nothing written, and the group serves the next good step.
void ExpectFailedStep(Client& r0, Client& r1, Code code) {
  for (size_t slot = 0; slot < r0.slots(); ++slot) {
    Status w = r0.Wait(slot);
    if (slot == 0) {
      EXPECT_EQ(w.code(), code) << w.ToString();
    }
    EXPECT_EQ(r0.flag(slot), kFlagFailed);
    EXPECT_EQ(r1.Wait(slot).code(), Code::kAborted);
    EXPECT_EQ(r1.flag(slot), kFlagFailed);
  }
  ASSERT_TRUE(r0.ReleaseOutputs().ok());
  ASSERT_TRUE(r1.ReleaseOutputs().ok());
}

TEST_F(EmbedServiceTest, BadRequestsFailTheirFlagsAndTheGroupGoesOn) {
  auto r0 = MakeClient(0, 0, 2), r1 = MakeClient(0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  const uint8_t kCanary = 0x5a;
  std::memset(r1->output(0).data(), kCanary, r1->output(0).size());
  struct Case {
    const char* what;
    uint32_t reqs, tokens;
    std::function<void(StepData&)> edit;
    Code code;
  };
  // Steps over the capacity are refused by the client (OverCapacityStepIsRefusedByTheClient)
  // and by the service (EmbedServiceHostile.OverCapacityRequestFailsUnderItsSeq).
  std::vector<Case> cases = {
      {"decreasing query starts", 4, 64, [](StepData& s) { s.qsl[2] = 1; }, Code::kInvalidArgument},
      {"id >= V", 4, 64, [](StepData& s) { s.tokens[10] = 1000; }, Code::kOutOfRange},
      {"context id >= V", 4, 64, [](StepData& s) { s.ctx[3] = 5000; }, Code::kOutOfRange},
      {"query start past the tokens", 2, 64, [](StepData& s) { s.qsl[2] = 65; }, Code::kOutOfRange},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    StepData s = MakeStep(std::min(k.reqs, 64u), std::min(k.tokens, 512u), 9);
    if (k.edit) k.edit(s);
    WriteInputs(*r0, s);
    ASSERT_TRUE(r0->PrepareForward(k.reqs, k.tokens, false).ok());
    ExpectFailedStep(*r0, *r1, k.code);
    for (size_t i = 0; i < r1->output(0).size(); ++i) ASSERT_EQ(r1->output(0)[i], kCanary);
  }
  Forward({r0.get(), r1.get()}, MakeStep(4, 256, 10));
  EXPECT_EQ(server_->stats().steps_failed, cases.size());
}

TEST_F(EmbedServiceTest, TruncatedRequestFailsTheStep) {
  auto r0 = MakeClient(0, 0, 2), r1 = MakeClient(0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  // A raw connection registered as rank 0 of a second group sends bytes of our choosing.
  std::unique_ptr<RawRank> k = RegisterRaw(path_, 7);
  ASSERT_TRUE(k);
  // A request naming another data-parallel rank fails as well.
  ASSERT_TRUE(Send(k->fd.get(), Encode(Request{5, 10, 1, 3})).ok());
  Result<AnyMessage> reply = k->Next();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(std::get<Reply>(*reply).status.code(), Code::kInvalidArgument);
  EXPECT_EQ(std::get<Reply>(*reply).seq, 5u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(LoadFlag(k->flag(i)), kFlagFailed);
  k->SetFlags(kFlagReset);  // released
  std::string req = Encode(Request{1, 10, 1, 7});
  ASSERT_TRUE(Send(k->fd.get(), std::string_view(req).substr(0, req.size() - 1)).ok());
  reply = k->Next();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(std::get<Reply>(*reply).status.code(), Code::kInvalidArgument);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(LoadFlag(k->flag(i)), kFlagFailed);
  // The other group never noticed.
  Forward({r0.get(), r1.get()}, MakeStep(2, 32, 11));
}

TEST_F(EmbedServiceTest, BadRegistrationsAreRefused) {
  auto expect = [&](ClientOptions o, Code code) {
    auto c = Client::Create(o);
    EXPECT_EQ(c.status().code(), code) << c.status().ToString();
  };
  ClientOptions o = SmallClientOptions(path_, 0, 0, 1);
  o.layers = {0, 5};  // layer 5 is not served
  expect(o, Code::kNotFound);
  o = SmallClientOptions(path_, 0, 0, 1);
  o.token_bytes = kTokenBytes * 2;
  expect(o, Code::kInvalidArgument);
  o = SmallClientOptions(path_, 0, 0, 1);
  o.context_len = 3;
  expect(o, Code::kInvalidArgument);
  auto first = MakeClient(0, 0, 2);
  ASSERT_TRUE(first);
  expect(SmallClientOptions(path_, 0, 0, 2), Code::kAlreadyExists);
  expect(SmallClientOptions(path_, 0, 1, 4), Code::kInvalidArgument);  // tp_size differs
  EXPECT_EQ(server_->stats().live_clients, 1u);
}

TEST_F(EmbedServiceTest, RegisteredOffsetsOutsideTheMemoryAreRefused) {
  auto small = SharedMemory::Create("small", 4096);
  ASSERT_TRUE(small.ok());
  Register reg = SmallRegister(0, 1, 2);
  reg.layers = {{0, 0, 1024, "", ""}};  // 64 KiB of output in 4 KiB
  Result<UniqueFd> fd = ConnectTo(path_);
  ASSERT_TRUE(fd.ok());
  int fds[] = {(*small)->fd()};
  ASSERT_TRUE(Send(fd->get(), Encode(reg), fds).ok());
  Result<AnyMessage> m = NextMessage(fd->get());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::get<Registered>(*m).status.code(), Code::kOutOfRange);
  // Missing descriptor.
  fd = ConnectTo(path_);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(Send(fd->get(), Encode(reg)).ok());
  m = NextMessage(fd->get());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::get<Registered>(*m).status.code(), Code::kInvalidArgument);
  EXPECT_EQ(server_->stats().live_clients, 0u);
}

TEST_F(EmbedServiceTest, ClosedClientFreesItsRegistration) {
  auto a0 = MakeClient(0, 0, 1);
  auto b0 = MakeClient(1, 0, 2), b1 = MakeClient(1, 1, 2);
  ASSERT_TRUE(a0 && b0 && b1);
  b1->Close();
  for (int i = 0; i < 500 && server_->stats().live_clients != 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(server_->stats().live_clients, 2u);
  Forward({a0.get()}, MakeStep(4, 128, 12));
  // The same rank registers again and its group serves.
  b1 = MakeClient(1, 1, 2);
  ASSERT_TRUE(b1);
  Forward({b0.get(), b1.get()}, MakeStep(4, 128, 13));
}

TEST_F(EmbedServiceTest, StoppedServiceFailsEveryWait) {
  auto r0 = MakeClient(0, 0, 2), r1 = MakeClient(0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  Forward({r0.get(), r1.get()}, MakeStep(2, 64, 14));
  // Rank 1 holds its outputs of a (dummy) forward, so the next step stops at its first layer.
  StepData s = MakeStep(2, 64, 15);
  WriteInputs(*r0, s);
  ASSERT_TRUE(r0->PrepareForward(2, 64, true).ok());  // fills flags with DONE locally
  ASSERT_TRUE(r1->PrepareForward(2, 64, true).ok());
  ASSERT_TRUE(r0->ReleaseOutputs().ok());  // rank 0 released, rank 1 holds its outputs
  ASSERT_TRUE(r0->PrepareForward(2, 64, false).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  // The step in flight fails with the service's kAborted; then the lost connection is
  // reported on every call.
  Status w = r0->Wait(0);
  EXPECT_EQ(w.code(), Code::kAborted) << w.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (size_t slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(r0->flag(slot), kFlagFailed);
    w = r0->Wait(slot);
    EXPECT_EQ(w.code(), Code::kUnavailable) << w.ToString();
  }
  EXPECT_EQ(r0->PrepareForward(2, 64, false).code(), Code::kUnavailable);
  EXPECT_EQ(r1->ReleaseOutputs().code(), Code::kUnavailable);
  EXPECT_EQ(r1->Wait(0).code(), Code::kUnavailable);
}

TEST(EmbedServiceQueue, StepsPastTheQueueLimitFailWithResourceExhausted) {
  std::string path = TempSocketPath("queue");
  ServerOptions o = SmallServerOptions(path);
  o.max_queued_steps = 2;
  std::unique_ptr<Server> server = StartServer(o);
  ASSERT_TRUE(server);
  // A raw rank 0: a client refuses to send a step before the previous one is released.
  std::unique_ptr<RawRank> k = RegisterRaw(path, 0);
  ASSERT_TRUE(k);
  // Unreleased outputs hold the first step at its first layer.
  k->SetFlags(kFlagDone);
  StepData s = MakeStep(4, 64, 20);
  k->Write(s);
  ASSERT_TRUE(Send(k->fd.get(), Encode(Request{1, 64, 4, 0})).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the worker holds step 1
  for (uint64_t seq = 2; seq <= 4; ++seq)
    ASSERT_TRUE(Send(k->fd.get(), Encode(Request{seq, 64, 4, 0})).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  k->SetFlags(kFlagReset);
  // Steps 1 to 3 run (two queued); step 4 was refused.
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    SCOPED_TRACE(seq);
    Reply r = k->NextReply();
    EXPECT_EQ(r.seq, seq);
    if (seq < 4) {
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      for (size_t slot = 0; slot < 3; ++slot) EXPECT_EQ(LoadFlag(k->flag(slot)), kFlagDone);
    } else {
      EXPECT_EQ(r.status.code(), Code::kResourceExhausted) << r.status.ToString();
    }
    k->SetFlags(kFlagReset);
  }
  EXPECT_EQ(server->stats().steps_ok, 3u);
  EXPECT_EQ(server->stats().steps_failed, 1u);
}

TEST(EmbedServiceMessages, OnlyRankZeroSendsRequestsAndRegistrationIsOnce) {
  std::string path = TempSocketPath("messages");
  std::unique_ptr<Server> server = StartServer(SmallServerOptions(path));
  ASSERT_TRUE(server);
  auto out = SharedMemory::Create("out", 3 * 512 * kTokenBytes + 4096);
  ASSERT_TRUE(out.ok());
  Register reg = SmallRegister(4, 1, 2);
  Result<UniqueFd> fd = ConnectTo(path);
  ASSERT_TRUE(fd.ok());
  int fds[] = {(*out)->fd()};
  ASSERT_TRUE(Send(fd->get(), Encode(reg), fds).ok());
  auto reply = [&]() -> Status {
    Result<AnyMessage> d = NextMessage(fd->get());
    if (!d.ok()) return d.status();
    if (auto* r = std::get_if<Registered>(&*d)) return r->status;
    return std::get<Reply>(*d).status;
  };
  ASSERT_TRUE(reply().ok());
  ASSERT_TRUE(Send(fd->get(), Encode(Request{1, 8, 1, 4})).ok());
  EXPECT_EQ(reply().code(), Code::kFailedPrecondition);
  ASSERT_TRUE(Send(fd->get(), Encode(reg), fds).ok());
  EXPECT_EQ(reply().code(), Code::kInvalidArgument);
  EXPECT_EQ(server->stats().live_clients, 1u);
  EXPECT_EQ(server->stats().steps_ok + server->stats().steps_failed, 0u);
}

}  // namespace
}  // namespace ferry::embed::service
