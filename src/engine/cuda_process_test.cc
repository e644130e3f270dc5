// GPU memory between two processes on one host: cuda_ipc (both sides GPU memory, direct) and
// ucx staged through bounce buffers (GPU->host, host->GPU, GPU->GPU), against a
// ferry_test_peer child whose buffer is GPU memory. Every byte is checked (the peer hashes its
// buffer). Works with one GPU (both processes on device 0); cases that need two skip with the
// reason, as does everything where no GPU is usable. Data both ways, killed, stopped and
// restarted peers over cuda_ipc: the cross-process suite (process_conformance_test.cc).
#include <signal.h>

#include <thread>

#include "ferry/engine.h"
#include "testing/cuda_buffer.h"
#include "testing/peer_process.h"

namespace ferry {
namespace {

using namespace cuda_testing;  // NOLINT: test helpers
using testing::PeerProcess;
using namespace std::chrono_literals;

// The peer's initial buffer (test_peer.cc's Fill with seed 1).
std::vector<uint8_t> PeerPattern(size_t n, uint64_t seed = 1) {
  std::vector<uint8_t> buf(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf[i] = static_cast<uint8_t>(x);
  }
  return buf;
}

std::string HashOf(const std::vector<uint8_t>& v) { return "HASH " + std::to_string(testing::Fnv(v.data(), v.size())); }

struct Rig {
  ~Rig() {
    // The peer exits on its own (its engine unlinks its lease table), then this one closes.
    if (peer) (void)peer->Command("exit");
  }
  std::unique_ptr<Buffer> buf;  // outlives the engine
  std::unique_ptr<Engine> engine;
  std::unique_ptr<PeerProcess> peer;
  MemoryDesc local;
  Session session;
  int notes = 0;  // notifications the peer received so far
};

// This process: an engine on `transports` with a buffer at `loc`; the peer: `peer_kind`
// memory, started with `peer_transports`.
std::unique_ptr<Rig> MakeRig(size_t bytes, Loc loc, std::vector<std::string> transports, const std::string& peer_kind,
                             const std::string& peer_transports, int peer_device = 0,
                             std::vector<std::string> peer_extra = {}) {
  signal(SIGPIPE, SIG_IGN);  // a command to a peer a test killed must fail, not end this process
  auto r = std::make_unique<Rig>();
  r->buf = Buffer::Make(loc, bytes);
  if (!r->buf) return nullptr;
  EngineOptions options;
  options.transports = std::move(transports);
  options.default_deadline = 60s;
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  r->engine = std::move(e).value();
  auto d = r->engine->RegisterMemory(r->buf->ptr(), bytes, loc.kind, loc.device);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  r->local = *d;
  std::vector<std::string> args = {"--kind", peer_kind, "--device", std::to_string(peer_device),
                                   "--transports", peer_transports};
  args.insert(args.end(), peer_extra.begin(), peer_extra.end());
  r->peer = PeerProcess::Start(bytes, args);
  EXPECT_TRUE(r->peer) << "ferry_test_peer did not start";
  if (!r->peer) return nullptr;
  EXPECT_TRUE(r->engine->AddPeer(r->peer->engine).ok());
  auto s = r->engine->OpenSession(r->local, r->peer->memory);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  r->session = *s;
  return r;
}

// Writes scattered ops with a notification, checks the peer's whole buffer; reads them back.
void WriteReadVerify(Rig& r, const std::vector<TransferOp>& ops, uint64_t seed) {
  const size_t n = r.buf->size();
  auto data = RandomBytes(n, seed);
  r.buf->Upload(data);
  auto expected = PeerPattern(n);
  ASSERT_EQ(r.peer->Command("fill 1"), "OK");
  TransferOptions o;
  o.notification = "written-" + std::to_string(seed);
  Transfer w = r.session.WriteBatch(ops, o);
  ASSERT_TRUE(w.Wait().ok()) << w.status().ToString();
  for (const auto& op : ops) std::memcpy(expected.data() + op.remote_offset, data.data() + op.local_offset, op.size);
  EXPECT_EQ(r.peer->Command("hash 0 " + std::to_string(n)), HashOf(expected));
  EXPECT_EQ(r.peer->Command("notes"), "NOTES " + std::to_string(++r.notes) + " written-" + std::to_string(seed));

  r.buf->Upload(std::vector<uint8_t>(n, 0));
  Transfer rd = r.session.ReadBatch(ops);
  ASSERT_TRUE(rd.Wait().ok()) << rd.status().ToString();
  ExpectApplied(expected, r.buf->Download(), ops, /*write=*/false);
}

class CudaIpcProcess : public ::testing::Test {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_CUDA(1); }
};

TEST_F(CudaIpcProcess, ScatteredWritesAndReadsOnOneGpu) {
  const size_t kBytes = 64 << 20;
  auto r = MakeRig(kBytes, kGpu0, {"cuda_ipc", "ucx"}, "cuda", "cuda_ipc,ucx");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session.path().transport, "cuda_ipc");
  EXPECT_FALSE(r->session.path().staged);
  WriteReadVerify(*r, Scattered(kBytes, 20000, 3000, 1), 2);  // small misaligned pieces: one kernel
  // A write and a read of 20,000 pieces each: a few kernel launches, no DMA call.
  EngineStats st = r->engine->stats();
  EXPECT_EQ(st.gpu_kernel_pieces, 40000u);
  EXPECT_GE(st.gpu_kernel_launches, 2u);
  EXPECT_LE(st.gpu_kernel_launches, 8u);
  EXPECT_EQ(st.gpu_dma_calls, 0u);
  std::vector<TransferOp> kv;  // KV-shaped: 32 KiB blocks, reversed, and a few 4 MiB pieces
  for (uint64_t i = 0; i < 1024; ++i) kv.push_back({i * 32768, (1023 - i) * 32768, 32768});
  for (uint64_t i = 0; i < 4; ++i) kv.push_back({(32 << 20) + i * (4 << 20), (32 << 20) + (3 - i) * (4 << 20), 4 << 20});
  WriteReadVerify(*r, kv, 3);
  EXPECT_EQ(r->session.Write(0, 0, 64).path().transport, "cuda_ipc");
}

// An engine's transports copy on one set of copy engines: a batch through `local` (to another
// buffer of this engine) and one through cuda_ipc (to the peer) count in the same stats.
TEST_F(CudaIpcProcess, LocalAndCudaIpcBatchesCountInOneEngineStats) {
  const size_t kBytes = 16 << 20;
  auto r = MakeRig(kBytes, kGpu0, {"local", "cuda_ipc", "ucx"}, "cuda", "cuda_ipc,ucx");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->session.path().transport, "cuda_ipc");
  auto other = Buffer::Make(kGpu0, kBytes);
  ASSERT_TRUE(other);
  auto od = r->engine->RegisterMemory(other->ptr(), kBytes, MemoryKind::kCuda, 0);
  ASSERT_TRUE(od.ok()) << od.status().ToString();
  auto to_self = r->engine->OpenSession(r->local, *od);
  ASSERT_TRUE(to_self.ok()) << to_self.status().ToString();
  EXPECT_EQ(to_self->path().transport, "local");
  const auto ops = Scattered(kBytes, 5000, 1500, 7);  // small pieces on one GPU: kernels only
  Transfer through_local = to_self->WriteBatch(ops);
  ASSERT_TRUE(through_local.Wait().ok()) << through_local.status().ToString();
  Transfer through_ipc = r->session.WriteBatch(ops);
  ASSERT_TRUE(through_ipc.Wait().ok()) << through_ipc.status().ToString();
  EngineStats st = r->engine->stats();
  EXPECT_EQ(st.gpu_kernel_pieces + st.merged_ops, 2 * ops.size());
  EXPECT_GE(st.gpu_kernel_launches, 2u);
  EXPECT_EQ(st.gpu_dma_calls, 0u);
  EXPECT_TRUE(r->engine->DeregisterMemory(od->region).ok());  // before `other` is freed
}

TEST_F(CudaIpcProcess, RevokedRegionFailsFurtherBatches) {
  auto r = MakeRig(1 << 20, kGpu0, {"cuda_ipc", "ucx"}, "cuda", "cuda_ipc,ucx");
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->session.Write(0, 0, 4096).Wait().ok());
  ASSERT_EQ(r->peer->Command("dereg"), "DEREG OK");
  EXPECT_EQ(r->session.Write(0, 0, 4096).Wait().code(), Code::kFailedPrecondition);
  EXPECT_EQ(r->session.Read(0, 0, 4096).Wait().code(), Code::kFailedPrecondition);
}

// GPU memory that the peer mapped from three cuMem allocations (as PyTorch's expandable
// segments and sleep-mode allocators make it) has no IPC handle: it is carried as the
// allocations' descriptors, mapped here through pidfd_getfd, and goes direct through cuda_ipc.
TEST_F(CudaIpcProcess, VmmMemoryGoesDirect) {
  const size_t kBytes = 24 << 20;
  auto r = MakeRig(kBytes, kGpu0, {"cuda_ipc", "ucx"}, "cuda", "cuda_ipc,ucx", 0, {"--alloc", "vmm"});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session.path().transport, "cuda_ipc");
  EXPECT_FALSE(r->session.path().staged);
  WriteReadVerify(*r, Scattered(kBytes, 4000, 12 << 10, 7), 41);  // across the allocations' ends
  std::vector<TransferOp> whole = {{0, 0, kBytes}};
  WriteReadVerify(*r, whole, 42);
  ASSERT_EQ(r->peer->Command("dereg"), "DEREG OK");
  EXPECT_EQ(r->session.Write(0, 0, 4096).Wait().code(), Code::kFailedPrecondition);
}

TEST_F(CudaIpcProcess, TwoGpusOneProcessEach) {
  FERRY_SKIP_WITHOUT_CUDA(2);
  const size_t kBytes = 32 << 20;
  auto r = MakeRig(kBytes, kGpu1, {"cuda_ipc", "ucx"}, "cuda", "cuda_ipc,ucx", /*peer_device=*/0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session.path().transport, "cuda_ipc");
  WriteReadVerify(*r, Scattered(kBytes, 5000, 16 << 10, 4), 5);
}

struct StagedCase {
  const char* name;
  Loc local;
  const char* peer_kind;
};

class UcxStagedProcess : public ::testing::TestWithParam<StagedCase> {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_CUDA(1); }
};

TEST_P(UcxStagedProcess, ScatteredWritesAndReads) {
  const size_t kBytes = 48 << 20;
  auto r = MakeRig(kBytes, GetParam().local, {"ucx"}, GetParam().peer_kind, "ucx");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session.path().transport, "ucx");
  EXPECT_TRUE(r->session.path().staged);
  WriteReadVerify(*r, Scattered(kBytes, 1000, 32 << 10, 6), 7);  // several 4 MiB chunks
  std::vector<TransferOp> big = {{0, 8 << 20, 24 << 20}, {30 << 20, 1, 1000}};  // cut across chunks
  WriteReadVerify(*r, big, 8);
}

TEST_P(UcxStagedProcess, KilledPeerMidPipelineFailsWithUnavailable) {
  const size_t kBytes = 256 << 20;
  auto r = MakeRig(kBytes, GetParam().local, {"ucx"}, GetParam().peer_kind, "ucx");
  ASSERT_TRUE(r);
  TransferOptions o;
  o.deadline = 20s;
  Transfer t = r->session.WriteBatch(Scattered(kBytes, 8192, 32 << 10, 3), o);
  r->peer->Kill(SIGKILL);
  Status s = t.WaitFor(25s);
  // Either every chunk landed before the kill, or the transfer failed as the peer went away.
  if (!s.ok()) {
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  }
  EXPECT_EQ(r->session.Write(0, 0, 4096).Wait().code(), Code::kUnavailable);
}

INSTANTIATE_TEST_SUITE_P(Directions, UcxStagedProcess,
                         ::testing::Values(StagedCase{"GpuToHost", kGpu0, "host"},
                                           StagedCase{"HostToGpu", kHostLoc, "cuda"},
                                           StagedCase{"GpuToGpu", kGpu0, "cuda"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry
