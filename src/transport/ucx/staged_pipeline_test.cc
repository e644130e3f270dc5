// The staged protocol end to end without a GPU: two ucx transports of this process whose
// "GPU" regions are host memory and whose stage copier copies with memcpy on a thread of its
// own (optionally held at a gate). Checks GPU->host, host->GPU and GPU->GPU writes and reads of
// scattered batches, the path reported, pipelining (several chunks in flight), and a peer that
// dies mid-pipeline: kUnavailable within the deadline, every bounce buffer back in its pool.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <thread>

#include "base/mutex.h"
#include "testing/bytes.h"
#include "testing/cuda_buffer.h"
#include "testing/transport_link.h"
#include "transport/ucx/staged.h"

namespace ferry::internal::ucx {
namespace {

using namespace std::chrono_literals;
using ::ferry::testing::RandomBytes;

// Copies on its own thread, like a copy engine; holds batches while the gate is closed.
class ThreadCopier final : public StageCopier {
 public:
  ThreadCopier() : thread_([this] { Loop(); }) {}
  ~ThreadCopier() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      closed_ = false;
    }
    cv_.NotifyAll();
    thread_.join();
  }
  bool gpu() const override { return true; }
  Status Copy(int, std::span<const StageCopy> copies, bool, std::function<void(const Status&)> done) override {
    MutexLock lock(&mu_);
    queue_.push_back({std::vector<StageCopy>(copies.begin(), copies.end()), std::move(done)});
    ++posted_;
    cv_.NotifyAll();
    return Status::Ok();
  }
  void Close() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    closed_ = true;
  }
  void Open() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      closed_ = false;
    }
    cv_.NotifyAll();
  }
  int posted() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return posted_;
  }
  int held() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }

 private:
  struct Job {
    std::vector<StageCopy> copies;
    std::function<void(const Status&)> done;
  };
  void Loop() EXCLUDES(mu_) {
    mu_.Lock();
    for (;;) {
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || (!closed_ && !queue_.empty()); });
      if (queue_.empty()) break;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      for (const auto& c : job.copies) std::memcpy(c.dst, c.src, c.size);
      job.done(Status::Ok());
      mu_.Lock();
    }
    mu_.Unlock();
  }
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  int posted_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

struct Side {
  std::string key;
  std::unique_ptr<Transport> transport;
  Stager* stager = nullptr;
  ThreadCopier* copier = nullptr;
  std::vector<uint8_t> buf;
  std::shared_ptr<Region> region;
  MemoryDesc desc;
};

class StagedPipelineTest : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 24 << 20;  // several 4 MiB chunks

  void SetUp() override { options_.default_deadline = 20s; }

  std::unique_ptr<Side> Make(const std::string& key, MemoryKind kind) {
    auto s = std::make_unique<Side>();
    s->key = key + std::to_string(counter_++);
    auto copier = std::make_unique<ThreadCopier>();
    s->copier = copier.get();
    TransportContext ctx{s->key, &options_, std::make_shared<Inbox>(16, 1024)};
    auto t = MakeUcxTransportWithCopier(ctx, std::move(copier), &s->stager);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return nullptr;
    s->transport = std::move(t).value();
    s->buf.assign(kBytes, 0);
    s->region = TestRegion(s->buf.data(), kBytes, 1, kind);
    auto access = s->transport->Register(s->region);
    EXPECT_TRUE(access.ok()) << access.status().ToString();
    s->desc = DescOf(*s->region, s->key, access);
    return s;
  }

  // A channel from a's region to `remote` (b's region, or a descriptor made of it).
  static Result<Link> Connect(Side& a, const Side& b, const MemoryDesc& remote) {
    return DialLink(*a.transport, EngineOf(b.key, *b.transport), a.region, remote);
  }

  // Sides a_ and b_ of the given kinds, and link_ from a_'s region to b_'s.
  void MakePair(MemoryKind a_kind, MemoryKind b_kind) {
    a_ = Make("a", a_kind);
    b_ = Make("b", b_kind);
    ASSERT_TRUE(a_ && b_);
    auto link = Connect(*a_, *b_, b_->desc);
    ASSERT_TRUE(link.ok()) << link.status().ToString();
    link_ = std::move(link).value();
  }

  static std::shared_ptr<TransferState> Post(Channel& ch, Op op, const std::vector<TransferOp>& ops,
                                             Duration deadline = 20s) {
    return PostBatch(ch, op, ops, deadline);
  }

  // Scattered pieces of 32 KiB (KV-block sized), shuffled on the remote side.
  static std::vector<TransferOp> KvOps(size_t count, uint64_t piece) {
    std::vector<TransferOp> ops;
    for (size_t i = 0; i < count; ++i) ops.push_back({i * piece, (count - 1 - i) * piece, piece - (i % 7)});
    return ops;
  }

  void RoundTrip(MemoryKind a_kind, MemoryKind b_kind) {
    ASSERT_NO_FATAL_FAILURE(MakePair(a_kind, b_kind));
    Channel& ch = *link_.channel;
    EXPECT_EQ(ch.path().transport, "ucx");
    EXPECT_TRUE(ch.path().staged);
    auto data = RandomBytes(kBytes, 11);
    std::memcpy(a_->buf.data(), data.data(), kBytes);
    auto ops = KvOps(kBytes / 32768, 32768);
    auto w = Post(ch, Op::kWrite, ops);
    ASSERT_TRUE(w->Wait(Deadline::After(20s)).ok()) << w->status().ToString();
    for (const auto& o : ops)
      ASSERT_EQ(std::memcmp(b_->buf.data() + o.remote_offset, data.data() + o.local_offset, o.size), 0);
    std::memset(a_->buf.data(), 0, kBytes);
    auto r = Post(ch, Op::kRead, ops);
    ASSERT_TRUE(r->Wait(Deadline::After(20s)).ok()) << r->status().ToString();
    for (const auto& o : ops)
      ASSERT_EQ(std::memcmp(a_->buf.data() + o.local_offset, data.data() + o.local_offset, o.size), 0);
    // One copier batch per 4 MiB chunk on the GPU sides, none on host sides.
    const int chunks = static_cast<int>(PlanChunks(ops, kStageChunkBytes, kStageMaxPieces).size());
    EXPECT_EQ(a_->copier->posted(), a_kind == MemoryKind::kCuda ? 2 * chunks : 0);
    EXPECT_EQ(b_->copier->posted(), b_kind == MemoryKind::kCuda ? 2 * chunks : 0);
    // Every bounce buffer comes back (a send's completion may trail its ack a little).
    for (int i = 0; i < 2000 && a_->stager->free_buffers() != a_->stager->allocated_buffers(); ++i)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(a_->stager->free_buffers(), a_->stager->allocated_buffers());
    for (int i = 0; i < 2000 && b_->stager->free_buffers() != b_->stager->allocated_buffers(); ++i)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(b_->stager->free_buffers(), b_->stager->allocated_buffers());
  }

  EngineOptions options_;
  int counter_ = 0;
  std::unique_ptr<Side> a_, b_;
  Link link_;  // destroyed before the sides
};

TEST_F(StagedPipelineTest, GpuToHost) { RoundTrip(MemoryKind::kCuda, MemoryKind::kHost); }
TEST_F(StagedPipelineTest, HostToGpu) { RoundTrip(MemoryKind::kHost, MemoryKind::kCuda); }
TEST_F(StagedPipelineTest, GpuToGpu) { RoundTrip(MemoryKind::kCuda, MemoryKind::kCuda); }

// Staged chunks into host memory take heap bounce buffers, bounded per engine: a chunk past the
// bound is answered kResourceExhausted and fails the initiator's transfer; within it the same
// write goes through, and every heap buffer is given back.
TEST_F(StagedPipelineTest, HeapBounceBuffersPastTheBoundAreRefused) {
  ASSERT_NO_FATAL_FAILURE(MakePair(MemoryKind::kCuda, MemoryKind::kHost));
  Channel& ch = *link_.channel;
  ASSERT_TRUE(ch.path().staged);
  auto ops = KvOps(kBytes / 32768, 32768);
  b_->stager->SetHeapBufferLimitForTest(0);
  auto refused = Post(ch, Op::kWrite, ops);
  Status st = refused->Wait(Deadline::After(20s));
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_EQ(b_->stager->heap_buffer_bytes(), 0u);
  // The failed transfer's other chunks, still in flight, are refused too before the bound rises.
  for (int i = 0; i < 2000 && a_->stager->free_buffers() != a_->stager->allocated_buffers(); ++i)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(100ms);
  // Room for a buffer or two: a single small chunk goes through.
  b_->stager->SetHeapBufferLimitForTest(size_t{8} << 20);
  auto one = Post(ch, Op::kWrite, {{0, 0, 65536}});
  st = one->Wait(Deadline::After(20s));
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (int i = 0; i < 2000 && b_->stager->heap_buffer_bytes() != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(b_->stager->heap_buffer_bytes(), 0u) << "a heap bounce buffer was not given back";
}

// GPU memory is reached only through the staged protocol. A descriptor that claims host memory
// for a GPU region makes the initiator send plain writes and reads (received with a CPU copy
// straight into the region): the target rejects and counts each, and no byte moves.
TEST_F(StagedPipelineTest, PlainAccessToGpuMemoryIsRejected) {
  auto a = Make("pa", MemoryKind::kHost);
  auto b = Make("pb", MemoryKind::kCuda);
  ASSERT_TRUE(a && b);
  MemoryDesc forged = b->desc;
  forged.kind = MemoryKind::kHost;
  auto link = Connect(*a, *b, forged);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  Channel& ch = *link->channel;
  EXPECT_FALSE(ch.path().staged);
  std::memset(a->buf.data(), 0x5A, kBytes);
  const std::vector<TransferOp> small{{0, 0, 4096}};
  const std::vector<TransferOp> large{{0, 4096, 1 << 20}};  // rendezvous
  for (const auto* ops : {&small, &large}) {
    auto w = Post(ch, Op::kWrite, *ops);
    Status st = w->Wait(Deadline::After(20s));
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.ToString();
  }
  std::vector<uint8_t> zeros(kBytes, 0);
  EXPECT_EQ(b->buf, zeros) << "a plain write reached GPU memory";
  std::memset(b->buf.data(), 0x33, kBytes);
  auto r = Post(ch, Op::kRead, small);
  EXPECT_EQ(r->Wait(Deadline::After(20s)).code(), Code::kUnsupported);
  EXPECT_EQ(a->buf[0], 0x5A) << "a plain read took GPU memory";
  EXPECT_EQ(b->transport->rejected_messages(), 3u);
  EXPECT_EQ(b->copier->posted(), 0);
  // The honest descriptor still works on the same connection.
  auto honest = link->endpoint->OpenChannel(a->region, b->desc);
  ASSERT_TRUE(honest.ok()) << honest.status().ToString();
  auto w = Post(**honest, Op::kWrite, small);
  ASSERT_TRUE(w->Wait(Deadline::After(20s)).ok()) << w->status().ToString();
  EXPECT_EQ(b->buf[0], 0x5A);
}

TEST_F(StagedPipelineTest, ChunksArePipelined) {
  ASSERT_NO_FATAL_FAILURE(MakePair(MemoryKind::kCuda, MemoryKind::kHost));
  Channel& ch = *link_.channel;
  a_->copier->Close();
  auto w = Post(ch, Op::kWrite, KvOps(kBytes / 32768, 32768));
  // Six chunks: all gathered at once into bounce buffers, none waiting for the previous send.
  for (int i = 0; i < 2000 && a_->copier->held() < 6; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(a_->copier->held(), 6);
  a_->copier->Open();
  ASSERT_TRUE(w->Wait(Deadline::After(20s)).ok()) << w->status().ToString();
}

TEST_F(StagedPipelineTest, ConcurrentTransfersShareTheBounceBuffers) {
  ASSERT_NO_FATAL_FAILURE(MakePair(MemoryKind::kCuda, MemoryKind::kCuda));
  Channel& ch = *link_.channel;
  auto data = RandomBytes(kBytes, 21);
  std::memcpy(a_->buf.data(), data.data(), kBytes);
  // Four writes of a quarter each (six chunks apiece) and then four reads: more chunks at once
  // than bounce buffers, so jobs wait for buffers that other jobs' completions give back.
  const uint64_t quarter = kBytes / 4;
  std::vector<std::vector<TransferOp>> parts(4);
  for (uint64_t q = 0; q < 4; ++q)
    for (uint64_t off = 0; off < quarter; off += 16384) parts[q].push_back({q * quarter + off, (3 - q) * quarter + off, 16384});
  std::vector<std::shared_ptr<TransferState>> writes;
  for (auto& p : parts) writes.push_back(Post(ch, Op::kWrite, p));
  for (auto& w : writes) ASSERT_TRUE(w->Wait(Deadline::After(20s)).ok()) << w->status().ToString();
  for (uint64_t q = 0; q < 4; ++q)
    ASSERT_EQ(std::memcmp(b_->buf.data() + (3 - q) * quarter, data.data() + q * quarter, quarter), 0) << q;
  std::memset(a_->buf.data(), 0, kBytes);
  std::vector<std::shared_ptr<TransferState>> reads;
  for (auto& p : parts) reads.push_back(Post(ch, Op::kRead, p));
  for (auto& r : reads) ASSERT_TRUE(r->Wait(Deadline::After(20s)).ok()) << r->status().ToString();
  EXPECT_EQ(std::memcmp(a_->buf.data(), data.data(), kBytes), 0);
  EXPECT_LE(a_->stager->allocated_buffers(), 2 * kStageBuffers);
}

TEST_F(StagedPipelineTest, APeerThatDiesMidPipelineFailsTheTransferAndReleasesEveryBuffer) {
  ASSERT_NO_FATAL_FAILURE(MakePair(MemoryKind::kCuda, MemoryKind::kCuda));
  Channel& ch = *link_.channel;
  // The target holds its scatters: chunks are sent but never acknowledged.
  b_->copier->Close();
  auto w = Post(ch, Op::kWrite, KvOps(kBytes / 32768, 32768), 10s);
  for (int i = 0; i < 5000 && b_->copier->held() == 0; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_GT(b_->copier->held(), 0);
  const auto start = std::chrono::steady_clock::now();
  b_->transport.reset();  // the peer goes away with chunks in flight
  Status s = w->Wait(Deadline::After(10s));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int i = 0; i < 2000 && a_->stager->free_buffers() != a_->stager->allocated_buffers(); ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_GT(a_->stager->allocated_buffers(), 0u);
  EXPECT_EQ(a_->stager->free_buffers(), a_->stager->allocated_buffers());
  // Later batches fail at once.
  EXPECT_EQ(Post(ch, Op::kWrite, {{0, 0, 64}})->Wait(Deadline::After(10s)).code(), Code::kUnavailable);
}


// The same protocol with the CUDA copier and real GPU memory on both sides, in one process
// (skips without a GPU): isolates the staged GPU path from the two-process tests.
TEST(StagedGpu, GpuToGpuThroughTheCopyEngine) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const size_t kBytes = 40 << 20;
  EngineOptions options;
  auto a_buf = cuda_testing::Buffer::Make(cuda_testing::kGpu0, kBytes);
  auto b_buf = cuda_testing::Buffer::Make(cuda_testing::kGpu0, kBytes);
  ASSERT_TRUE(a_buf && b_buf);
  Stager* a_stager = nullptr;
  auto make = [&](const std::string& key, Stager** stager) {
    TransportContext ctx{key, &options, std::make_shared<Inbox>(4, 64)};
    return MakeUcxTransportWithCopier(ctx, MakeCudaStageCopier(nullptr), stager);  // a set each
  };
  auto a = make("gpu-stage-a", &a_stager);
  auto b = make("gpu-stage-b", nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  auto local = TestRegion(a_buf->ptr(), kBytes, 1, MemoryKind::kCuda);
  auto remote = TestRegion(b_buf->ptr(), kBytes, 2, MemoryKind::kCuda);
  auto link = OpenLink(**a, **b, "gpu-stage-b", local, remote);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  Channel& ch = *link->channel;
  EXPECT_TRUE(ch.path().staged);
  auto data = RandomBytes(kBytes, 5);
  a_buf->Upload(data);
  auto ops = cuda_testing::Scattered(kBytes, 4000, 32 << 10, 6);
  ops.push_back({kBytes - (9 << 20), 0, 9 << 20});  // one piece over several chunks
  ops.erase(std::remove_if(ops.begin(), ops.end() - 1, [&](const TransferOp& o) {
              return o.remote_offset < (9u << 20) || o.local_offset + o.size > kBytes - (9u << 20);
            }),
            ops.end() - 1);
  auto w = PostBatch(ch, Op::kWrite, ops, 30s);
  ASSERT_TRUE(w->Wait(Deadline::After(30s)).ok()) << w->status().ToString();
  auto at_b = b_buf->Download();
  cuda_testing::ExpectApplied(data, at_b, ops, true);
  a_buf->Upload(std::vector<uint8_t>(kBytes, 0));
  auto r = PostBatch(ch, Op::kRead, ops, 30s);
  ASSERT_TRUE(r->Wait(Deadline::After(30s)).ok()) << r->status().ToString();
  cuda_testing::ExpectApplied(at_b, a_buf->Download(), ops, false);
  for (int i = 0; i < 2000 && a_stager->free_buffers() != a_stager->allocated_buffers(); ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(a_stager->free_buffers(), a_stager->allocated_buffers());
}

}  // namespace
}  // namespace ferry::internal::ucx
