// The service's phase timings in host mode: counted per token bucket and layer, read in-process
// (Server::stats) and over the socket (QueryStats), reset on request; a stats connection may
// not send step requests; and the copy pump's path driven with host outputs.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "embed/service/protocol.h"
#include "embed/service/unix_socket.h"
#include "ferry/embed_stats.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

const PhaseSummary& Of(const BucketStats& b, Phase p) { return b.phases[static_cast<size_t>(p)]; }

using EmbedServiceStatsTest = SmallServiceTest;

TEST_F(EmbedServiceStatsTest, PhasesPerBucketAndLayer) {
  auto c = MakeClient(0, 0, 1);
  ASSERT_TRUE(c);
  for (uint32_t i = 0; i < 4; ++i) Forward({c.get()}, MakeStep(4, 300, i));  // bucket 256
  Forward({c.get()}, MakeStep(8, 64, 9));                                    // bucket 64
  // The reply of the last step may trail its DONE flags: wait for the counters.
  for (int i = 0; i < 500 && server_->stats().steps_ok < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Result<ServerStats> q = QueryStats(path_, true, std::chrono::seconds(5));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->steps_ok, 5u);
  EXPECT_EQ(q->live_clients, 1u);
  ASSERT_EQ(q->buckets.size(), 2u);
  const BucketStats& small = q->buckets[0];
  const BucketStats& big = q->buckets[1];
  EXPECT_EQ(small.bucket, 64u);
  EXPECT_EQ(big.bucket, 256u);
  // One sample per layer step: 3 layers, host outputs run the CPU path.
  EXPECT_EQ(big.cpu_steps, 12u);
  EXPECT_EQ(big.uva_steps, 0u);
  EXPECT_EQ(big.copies, 0u);  // one rank: rows gathered into its buffer, nothing copied
  EXPECT_EQ(small.cpu_steps, 3u);
  EXPECT_EQ(Of(big, Phase::kLayer).count, 12u);
  EXPECT_EQ(Of(big, Phase::kGather).count, 12u);
  EXPECT_EQ(Of(big, Phase::kStep).count, 12u);
  // Queue and inputs are per step (the first layer).
  EXPECT_EQ(Of(big, Phase::kQueue).count, 4u);
  EXPECT_EQ(Of(big, Phase::kInputs).count, 4u);
  EXPECT_GT(Of(big, Phase::kGather).sum_ns, 0u);
  EXPECT_GE(Of(big, Phase::kStep).median_ns, Of(big, Phase::kLayer).median_ns);
  // Reset: the timings are gone, the counters stay.
  ServerStats after = server_->stats();
  EXPECT_TRUE(after.buckets.empty());
  EXPECT_EQ(after.steps_ok, 5u);
  EXPECT_FALSE(FormatStats(*q).empty());
}

TEST_F(EmbedServiceStatsTest, StatsConnectionCannotStep) {
  Result<UniqueFd> fd = ConnectTo(path_);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(Send(fd->get(), Encode(StatsRequest{false})).ok());
  Result<AnyMessage> d = NextMessage(fd->get());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(std::holds_alternative<Stats>(*d));
  // A step request on it is not a registration: refused, and the connection closed.
  ASSERT_TRUE(Send(fd->get(), Encode(Request{1, 8, 1, 0})).ok());
  d = NextMessage(fd->get());
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(std::holds_alternative<Registered>(*d));
  EXPECT_EQ(std::get<Registered>(*d).status.code(), Code::kFailedPrecondition);
  EXPECT_EQ(server_->stats().steps_ok + server_->stats().steps_failed, 0u);
}

TEST_F(EmbedServiceStatsTest, NoServiceIsUnavailable) {
  Result<ServerStats> q = QueryStats(path_ + ".none", false, std::chrono::milliseconds(50));
  EXPECT_EQ(q.status().code(), Code::kUnavailable) << q.status().ToString();
}

// A query that could never wait (or would wait past the limit) is refused before connecting.
TEST_F(EmbedServiceStatsTest, TimeoutOutsideItsRangeIsInvalid) {
  EXPECT_EQ(QueryStats(path_, false, std::chrono::nanoseconds(0)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(QueryStats(path_, false, std::chrono::seconds(-1)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(QueryStats(path_, false, kMaxQueryTimeout + std::chrono::seconds(1)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(server_->stats().registrations, 0u);
  Result<ServerStats> ok = QueryStats(path_, false, kMaxQueryTimeout);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

// The copy pump's path (CUDA outputs' copies), driven with host outputs: rank 1's rows are
// copied from rank 0's buffer by the pump in runs of >= 128 tokens (but the last), behind the
// gather; the gather's chunks are 16 tokens.
TEST(EmbedServicePumpTest, PumpedCopiesReachTheOtherRank) {
  const std::string path = TempSocketPath("pump");
  ServerOptions o = SmallServerOptions(path);
  o.pump_host_copies = true;
  o.min_copy_bytes = 128 * kTokenBytes;
  std::unique_ptr<Server> server = StartServer(o);
  ASSERT_TRUE(server);
  auto r0 = MakeClient(path, 0, 0, 2), r1 = MakeClient(path, 0, 1, 2);
  ASSERT_TRUE(r0 && r1);
  StepData padded = MakeStep(3, 200, 5);
  padded.qsl.back() = 150;  // tokens 150.. are padding: zero rows on both ranks
  std::vector<StepData> steps = {MakeStep(4, 512, 1), MakeStep(64, 64, 2), MakeStep(1, 1, 3),
                                 padded, MakeStep(7, 333, 4)};
  for (const StepData& s : steps) {
    // Rank 1's previous rows are overwritten, so stale bytes would show.
    std::memset(r1->output(0).data(), 0xab, r1->output(0).size());
    Forward({r0.get(), r1.get()}, s);
  }
  for (int i = 0; i < 500 && server->stats().steps_ok < steps.size(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(server->stats().steps_ok, steps.size());
  EXPECT_EQ(server->stats().steps_failed, 0u);
  // The 512-token step: at most 5 copies per layer (4 runs of >= 128 tokens and a last one),
  // not one per 16-token chunk (32).
  ServerStats st = server->stats();
  bool found = false;
  for (const BucketStats& b : st.buckets) {
    if (b.bucket != 512) continue;
    found = true;
    EXPECT_EQ(b.cpu_steps, 3u);
    EXPECT_GE(b.copies, 3u);
    EXPECT_LE(b.copies, 15u);
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace ferry::embed::service
