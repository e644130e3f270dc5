// CUDA mode, end to end: the service in a child process opens the clients' device output
// buffers and flags through CUDA IPC, copies the gathered rows with asynchronous copies and
// sets DONE with stream memory writes; the clients' waits are stream memory waits. Skips,
// saying why, without a usable GPU. The service is the `ferry embed-serve` binary (FERRY_BIN)
// with the tests' small synthetic model (embed_service.h). The UVA tests force the UVA path
// (--uva always) or let the service choose (--uva auto) and check the same bytes as the CPU
// path's, and the service's counts of the paths it ran (QueryStats).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "cuda/runtime.h"
#include "cuda/stream_ops.h"
#include "ferry/embed_stats.h"
#include "testing/embed_service.h"

namespace ferry::embed::service {
namespace {

using namespace testing;

class EmbedServiceCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempSocketPath(std::string("cuda-") +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    // A fresh `ferry embed-serve` process (a fork would inherit this process's CUDA state).
    std::string ready = path_ + ".ready";
    ::unlink(ready.c_str());
    // Before the service starts: --uva always makes it refuse to start without a GPU.
    std::string reason;
    if (!cuda::StreamOpsUsable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
    std::vector<std::string> args = {FERRY_BIN,
                                     "embed-serve",
                                     "--socket",
                                     path_,
                                     "--ready-file",
                                     ready,
                                     "--vocab",
                                     "1000",
                                     "--eos",
                                     "2",
                                     "--heads",
                                     "2",
                                     "--embed-dim",
                                     "64",
                                     "--base-vocab",
                                     "97",
                                     "--padding",
                                     "8",
                                     "--layers",
                                     "0",
                                     "1",
                                     "2",
                                     "--threads",
                                     "2",
                                     "--chunk-tokens",
                                     "16",
                                     "--copy-min-kib",
                                     "4",
                                     "--wait-timeout",
                                     "5"};
    for (const std::string& a : ExtraArgs()) args.push_back(a);
    service_ = ::fork();
    if (service_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(FERRY_BIN, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 2000 && ::access(ready.c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(::access(ready.c_str(), F_OK), 0) << FERRY_BIN << " embed-serve did not start";
    ASSERT_TRUE(cuda::SetDevice(0).ok());
    auto s = cuda::StreamCreate();
    ASSERT_TRUE(s.ok());
    stream_ = *s;
  }
  // More `ferry embed-serve` flags (the default is --uva auto).
  virtual std::vector<std::string> ExtraArgs() const { return {}; }
  void TearDown() override {
    if (stream_ != nullptr) (void)cuda::StreamDestroy(stream_);
    KillService();
  }
  void KillService() {
    if (service_ > 0) {
      ::kill(service_, SIGKILL);
      int status = 0;
      ::waitpid(service_, &status, 0);
      service_ = -1;
    }
  }
  std::unique_ptr<Client> MakeClient(uint32_t tp, uint32_t tp_size) {
    ClientOptions o = SmallClientOptions(path_, 0, tp, tp_size);
    o.mode = OutputMode::kCuda;
    o.device = 0;
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // Copies the slot's device rows to a host client-shaped buffer and checks them.
  void ExpectDeviceRows(Client& c, size_t slot, const StepData& s) {
    std::vector<uint8_t> host(s.tokens.size() * kTokenBytes);
    ASSERT_TRUE(cuda::MemcpyAsync(host.data(), c.device_output(slot), host.size(), stream_).ok());
    ASSERT_TRUE(cuda::StreamSync(stream_, Deadline::After(std::chrono::seconds(10))).ok());
    ExpectRowsAt(host.data(), slot, s);
  }
  void Forward(std::vector<Client*> ranks, const StepData& s, const StepSources* sources) {
    if (sources == nullptr) WriteInputs(*ranks[0], s);
    for (Client* c : ranks)
      ASSERT_TRUE(c->PrepareForward(s.qsl.size() - 1, s.tokens.size(), false, stream_,
                                    c == ranks[0] ? sources : nullptr)
                      .ok());
    for (Client* c : ranks) {
      for (size_t slot = 0; slot < c->slots(); ++slot) {
        ASSERT_TRUE(c->Wait(slot, stream_).ok());
        ExpectDeviceRows(*c, slot, s);
        EXPECT_EQ(c->flag(slot), kFlagDone);
      }
    }
    for (Client* c : ranks) ASSERT_TRUE(c->ReleaseOutputs(stream_).ok());
    ASSERT_TRUE(cuda::StreamSync(stream_, Deadline::After(std::chrono::seconds(10))).ok());
  }

  std::string path_;
  pid_t service_ = -1;
  void* stream_ = nullptr;
};

TEST_F(EmbedServiceCudaTest, RowsReachEveryTensorParallelRank) {
  auto r0 = MakeClient(0, 2), r1 = MakeClient(1, 2);
  ASSERT_TRUE(r0 && r1);
  Forward({r0.get(), r1.get()}, MakeStep(4, 512, 1), nullptr);
  Forward({r0.get(), r1.get()}, MakeStep(64, 64, 2), nullptr);
}

TEST_F(EmbedServiceCudaTest, InputsCopiedFromDeviceSources) {
  auto r0 = MakeClient(0, 1);
  ASSERT_TRUE(r0);
  StepData s = MakeStep(8, 256, 3);
  auto ids = cuda::Malloc(0, s.tokens.size() * 4);
  auto qsl = cuda::Malloc(0, s.qsl.size() * 4);
  auto ctx = cuda::Malloc(0, s.ctx.size() * 4);
  ASSERT_TRUE(ids.ok() && qsl.ok() && ctx.ok());
  ASSERT_TRUE(cuda::CopySync(*ids, s.tokens.data(), s.tokens.size() * 4).ok());
  ASSERT_TRUE(cuda::CopySync(*qsl, s.qsl.data(), s.qsl.size() * 4).ok());
  ASSERT_TRUE(cuda::CopySync(*ctx, s.ctx.data(), s.ctx.size() * 4).ok());
  StepSources src{static_cast<int32_t*>(*ids), static_cast<int32_t*>(*qsl),
                  static_cast<int32_t*>(*ctx)};
  Forward({r0.get()}, s, &src);
  (void)cuda::Free(*ids);
  (void)cuda::Free(*qsl);
  (void)cuda::Free(*ctx);
}

TEST_F(EmbedServiceCudaTest, DummyForwardOnTheStream) {
  auto r0 = MakeClient(0, 1);
  ASSERT_TRUE(r0);
  ASSERT_TRUE(r0->PrepareForward(1, 16, true, stream_).ok());
  for (size_t slot = 0; slot < r0->slots(); ++slot) ASSERT_TRUE(r0->Wait(slot, stream_).ok());
  ASSERT_TRUE(cuda::StreamSync(stream_, Deadline::After(std::chrono::seconds(10))).ok());
  std::vector<uint8_t> host(16 * kTokenBytes, 0xff);
  ASSERT_TRUE(cuda::CopySync(host.data(), r0->device_output(2), host.size()).ok());
  for (uint8_t b : host) ASSERT_EQ(b, 0);
  EXPECT_EQ(r0->flag(0), kFlagDone);
  ASSERT_TRUE(r0->ReleaseOutputs(stream_).ok());
  ASSERT_TRUE(cuda::StreamSync(stream_, Deadline::After(std::chrono::seconds(10))).ok());
  EXPECT_EQ(r0->flag(0), kFlagReset);
}

TEST_F(EmbedServiceCudaTest, OutputsOutsideTheirAllocationAreRefused) {
  auto small = cuda::Malloc(0, 4096);
  ASSERT_TRUE(small.ok());
  ClientOptions o = SmallClientOptions(path_, 0, 0, 1);
  o.mode = OutputMode::kCuda;
  o.max_tokens = 65536;  // 8 MiB per layer: past the allocation even if the driver rounds it up
  for (size_t i = 0; i < o.layers.size(); ++i) {
    o.cuda_outputs.push_back(*small);  // 4 KiB
    o.cuda_flags.push_back(static_cast<uint8_t*>(*small) + 64 * i);
  }
  auto c = Client::Create(o);
  EXPECT_EQ(c.status().code(), Code::kOutOfRange) << c.status().ToString();
  (void)cuda::Free(*small);
}

TEST_F(EmbedServiceCudaTest, KilledServiceReleasesTheStreamWait) {
  auto r0 = MakeClient(0, 2), r1 = MakeClient(1, 2);
  ASSERT_TRUE(r0 && r1);
  Forward({r0.get(), r1.get()}, MakeStep(4, 128, 4), nullptr);
  ASSERT_TRUE(r1->PrepareForward(1, 1, true, stream_).ok());  // rank 1 holds its outputs
  WriteInputs(*r0, MakeStep(4, 128, 5));
  ASSERT_TRUE(r0->PrepareForward(4, 128, false, stream_).ok());
  ASSERT_TRUE(r0->Wait(0, stream_).ok());  // the stream now waits on the service
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  KillService();
  Status s = cuda::StreamSync(stream_, Deadline::After(std::chrono::seconds(5)));
  EXPECT_TRUE(s.ok()) << "the stream stayed blocked: " << s.ToString();
  EXPECT_EQ(r0->flag(0), kFlagFailed);
  EXPECT_EQ(r0->Wait(1, stream_).code(), Code::kUnavailable);
  EXPECT_EQ(r0->PrepareForward(1, 1, false, stream_).code(), Code::kUnavailable);
}

// The layer steps each path ran for steps of `tokens` tokens, from the service's stats, once
// `total` were counted (a layer step is counted after its DONE completed, so just after the
// client saw it) or after 5 s.
std::pair<uint64_t, uint64_t> PathCounts(const std::string& socket, uint64_t tokens,
                                         uint64_t total) {
  std::pair<uint64_t, uint64_t> out{0, 0};
  for (int i = 0; i < 500 && out.first + out.second < total; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Result<ServerStats> st = QueryStats(socket, false, std::chrono::seconds(5));
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (!st.ok()) return out;
    for (const BucketStats& b : st->buckets)
      if (b.bucket == TokenBucket(tokens)) out = {b.cpu_steps, b.uva_steps};
  }
  return out;
}

// Steps the CPU path's tests run, and padding tokens past the last request (zero rows).
std::vector<StepData> UvaSteps() {
  std::vector<StepData> steps = {MakeStep(4, 512, 11), MakeStep(64, 64, 12), MakeStep(1, 1, 13)};
  StepData padded = MakeStep(2, 100, 14);
  padded.qsl.back() = 90;
  steps.push_back(padded);
  return steps;
}

// A path forced on the service (--uva always or off) and the layer steps of the 512-token step
// each path must have run (3 layers).
struct ForcedPath {
  const char* uva;
  uint64_t cpu_steps, uva_steps;
};

class EmbedServiceForcedPathTest : public EmbedServiceCudaTest,
                                   public ::testing::WithParamInterface<ForcedPath> {
 protected:
  std::vector<std::string> ExtraArgs() const override { return {"--uva", GetParam().uva}; }
};

TEST_P(EmbedServiceForcedPathTest, RowsEqualTheCpuPathsOnEveryRank) {
  auto r0 = MakeClient(0, 2), r1 = MakeClient(1, 2);
  ASSERT_TRUE(r0 && r1);
  for (const StepData& s : UvaSteps()) Forward({r0.get(), r1.get()}, s, nullptr);
  auto [cpu, uva] = PathCounts(path_, 512, 3);
  EXPECT_EQ(cpu, GetParam().cpu_steps);
  EXPECT_EQ(uva, GetParam().uva_steps);
}

// --uva always: every layer step ran the kernel; --uva off: the CPU path only.
INSTANTIATE_TEST_SUITE_P(Uva, EmbedServiceForcedPathTest,
                         ::testing::Values(ForcedPath{"always", 0, 3}, ForcedPath{"off", 3, 0}),
                         [](const ::testing::TestParamInfo<ForcedPath>& p) {
                           return std::string(p.param.uva);
                         });

class EmbedServiceUvaAutoTest : public EmbedServiceCudaTest {
 protected:
  std::vector<std::string> ExtraArgs() const override {
    return {"--uva", "auto", "--uva-probes", "2", "--uva-reprobe-every", "4"};
  }
};

TEST_F(EmbedServiceUvaAutoTest, BothPathsRunAndEveryStepIsRight) {
  auto r0 = MakeClient(0, 1);
  ASSERT_TRUE(r0);
  for (uint32_t i = 0; i < 12; ++i) Forward({r0.get()}, MakeStep(4, 256, 20 + i), nullptr);
  // 36 layer steps: 2 probes of each path, then the faster, and every 4th choice the other.
  auto [cpu, uva] = PathCounts(path_, 256, 36);
  EXPECT_EQ(cpu + uva, 36u);
  EXPECT_GE(cpu, 2u);
  EXPECT_GE(uva, 2u);
}

}  // namespace
}  // namespace ferry::embed::service
