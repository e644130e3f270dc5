// The cuda_ipc transport's protocol without a GPU: two transports in this process that take
// each other for processes of one host (distinct process tokens), a fake IPC api that "maps"
// host buffers standing in for GPU allocations, and a fake copier that copies with memcpy when
// the test opens its gate. Covers scattered writes and reads, one mapping per allocation,
// failures of cudaIpcOpenMemHandle, revocation, and deregistration waiting for a peer's batch.
#include "transport/cuda_ipc/transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "base/mutex.h"
#include "testing/bytes.h"
#include "testing/transport_link.h"

namespace ferry::internal::cuda_ipc {
namespace {

using namespace std::chrono_literals;
using ::ferry::testing::RandomBytes;

// "Allocations" are host buffers; a handle carries the allocation's address.
class FakeIpcApi final : public cuda::IpcApi {
 public:
  void AddAllocation(void* base, uint64_t size) {
    MutexLock lock(&mu_);
    allocations_[reinterpret_cast<uint64_t>(base)] = size;
  }
  Result<cuda::AllocationRange> GetAllocationRange(const void* ptr) override {
    MutexLock lock(&mu_);
    const auto p = reinterpret_cast<uint64_t>(ptr);
    for (auto& [base, size] : allocations_)
      if (p >= base && p < base + size) return cuda::AllocationRange{reinterpret_cast<void*>(base), size};
    return Status(Code::kInvalidArgument, "not device memory");
  }
  Result<cuda::IpcHandle> GetHandle(void* base) override {
    ++handles;
    cuda::IpcHandle h;
    const auto p = reinterpret_cast<uint64_t>(base);
    std::memcpy(h.bytes.data(), &p, sizeof(p));
    return h;
  }
  Result<void*> OpenHandle(const cuda::IpcHandle& h, int device) override {
    MutexLock lock(&mu_);
    if (!open_failure.ok()) return open_failure;
    ++opens;
    uint64_t p = 0;
    std::memcpy(&p, h.bytes.data(), sizeof(p));
    return reinterpret_cast<void*>(p);
  }
  Status CloseHandle(void*) override {
    ++closes;
    return Status::Ok();
  }

  Status open_failure;  // set before use, read under mu_
  std::atomic<int> opens{0}, closes{0}, handles{0};

 private:
  Mutex mu_;
  std::map<uint64_t, uint64_t> allocations_ GUARDED_BY(mu_);
};

// Copies with memcpy: at once, or when the test opens the gate.
class FakeCopier final : public Copier {
 public:
  struct Gate {
    Mutex mu;  // held while a batch is counted and held; the test reads the fields between batches
    bool closed = false;
    std::deque<std::function<void()>> held;
    int batches = 0;
    int last_device = -1;
  };
  explicit FakeCopier(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  Status Post(int device, const cuda::OffsetBatch& ops, bool, bool, Deadline,
              std::function<void(const Status&)> on_done) override {
    std::vector<cuda::Copy> batch;  // the ops live only during the call
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].size != 0) batch.push_back(ops[i]);
    auto run = [batch, on_done] {
      for (const auto& c : batch) std::memcpy(c.dst, c.src, c.size);
      on_done(Status::Ok());
    };
    {
      MutexLock lock(&gate_->mu);
      ++gate_->batches;
      gate_->last_device = device;
      if (gate_->closed) {
        gate_->held.push_back(run);
        return Status::Ok();
      }
    }
    run();
    return Status::Ok();
  }
  std::function<void()> Poller(int) override { return {}; }
  bool KernelReaches(int, const void*) override { return true; }

 private:
  std::shared_ptr<Gate> gate_;
};

void OpenGate(FakeCopier::Gate& gate) {
  std::deque<std::function<void()>> held;
  {
    MutexLock lock(&gate.mu);
    gate.closed = false;
    held.swap(gate.held);
  }
  for (auto& run : held) run();
}

struct Side {
  std::string key;
  std::unique_ptr<Transport> transport;
  std::vector<uint8_t> buf;  // the "GPU allocation"
  std::vector<std::shared_ptr<Region>> regions;
  std::vector<MemoryDesc> descs;
};

class CudaIpcProtocolTest : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 1 << 20;

  void SetUp() override {
    options_.default_deadline = 5s;
    inbox_ = std::make_shared<Inbox>(16, 1024);
    a_ = MakeSide("a", "100:a");
    b_ = MakeSide("b", "200:b");
    ASSERT_TRUE(a_.transport && b_.transport);
  }

  Side MakeSide(const std::string& key, const std::string& token) {
    Side s;
    s.key = key;
    s.buf.assign(kBytes, 0);
    api_.AddAllocation(s.buf.data(), kBytes);
    Seams seams;
    seams.api = &api_;
    seams.copier = std::make_unique<FakeCopier>(gate_);
    seams.process_token = token;
    TransportContext ctx{key, &options_, inbox_};
    auto t = MakeTransport(ctx, std::move(seams));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) s.transport = std::move(t).value();
    return s;
  }

  // Registers [offset, offset + size) of the side's buffer as a GPU region.
  MemoryDesc Register(Side& s, uint64_t offset, uint64_t size) {
    auto r = TestRegion(s.buf.data() + offset, size, next_region_++, MemoryKind::kCuda);
    auto access = s.transport->Register(r);
    EXPECT_TRUE(access.ok()) << access.status().ToString();
    MemoryDesc d = DescOf(*r, s.key, access);
    s.regions.push_back(r);
    s.descs.push_back(d);
    return d;
  }

  EngineDesc Describe(const Side& s) { return EngineOf(s.key, *s.transport); }

  // a's and b's whole buffers registered (b's is `*remote`), and a's endpoint to b; null when
  // the connection failed.
  std::shared_ptr<Endpoint> ConnectWhole(MemoryDesc* remote) {
    Register(a_, 0, kBytes);
    *remote = Register(b_, 0, kBytes);
    auto ep = a_.transport->Connect(Describe(b_));
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    return ep.ok() ? *ep : nullptr;
  }

  std::shared_ptr<TransferState> Post(Channel& ch, Op op, const std::vector<TransferOp>& ops) {
    return PostBatch(ch, op, ops, 5s);
  }

  EngineOptions options_;
  std::shared_ptr<Inbox> inbox_;
  FakeIpcApi api_;
  std::shared_ptr<FakeCopier::Gate> gate_ = std::make_shared<FakeCopier::Gate>();
  uint64_t next_region_ = 1;
  Side a_, b_;
};

TEST_F(CudaIpcProtocolTest, ScatteredWriteAndReadMoveTheBytes) {
  MemoryDesc local = Register(a_, 0, kBytes);
  MemoryDesc remote = Register(b_, 0, kBytes);
  ASSERT_TRUE(a_.transport->CanReach(Describe(b_)));
  auto ep = a_.transport->Connect(Describe(b_));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto ch = (*ep)->OpenChannel(a_.regions[0], remote);
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  EXPECT_EQ((*ch)->path().transport, "cuda_ipc");
  EXPECT_FALSE((*ch)->path().staged);

  auto data = RandomBytes(kBytes, 1);
  std::memcpy(a_.buf.data(), data.data(), kBytes);
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < 256; ++i) ops.push_back({i * 4096 + 3, (255 - i) * 4096 + 5, 1000 + i});
  auto w = Post(**ch, Op::kWrite, ops);
  ASSERT_TRUE(w->Wait(Deadline::After(5s)).ok()) << w->status().ToString();
  for (const auto& o : ops) ASSERT_EQ(std::memcmp(b_.buf.data() + o.remote_offset, data.data() + o.local_offset, o.size), 0);

  std::memset(a_.buf.data(), 0, kBytes);
  auto r = Post(**ch, Op::kRead, ops);
  ASSERT_TRUE(r->Wait(Deadline::After(5s)).ok()) << r->status().ToString();
  for (const auto& o : ops) ASSERT_EQ(std::memcmp(a_.buf.data() + o.local_offset, data.data() + o.local_offset, o.size), 0);
  EXPECT_EQ(gate_->batches, 2);  // one copier post per batch, not one per piece
  EXPECT_EQ(gate_->last_device, 0);
  (void)local;
}

TEST_F(CudaIpcProtocolTest, EachAllocationIsOpenedOnceAndClosedWhenAllItsRegionsAreRevoked) {
  Register(a_, 0, kBytes);
  MemoryDesc r1 = Register(b_, 0, 4096);
  MemoryDesc r2 = Register(b_, 65536, 4096);  // same allocation, another region
  auto ep = a_.transport->Connect(Describe(b_));
  ASSERT_TRUE(ep.ok());
  auto c1 = (*ep)->OpenChannel(a_.regions[0], r1);
  auto c2 = (*ep)->OpenChannel(a_.regions[0], r2);
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_EQ(api_.opens.load(), 1);
  EXPECT_EQ(api_.handles.load(), 2);  // a's allocation and b's, each exported once

  EXPECT_TRUE(b_.transport->Deregister(*b_.regions[0]).ok());
  auto t = Post(**c1, Op::kWrite, {{0, 0, 100}});
  EXPECT_EQ(t->Wait(Deadline::After(1s)).code(), Code::kFailedPrecondition);
  EXPECT_EQ(api_.closes.load(), 0);  // r2 still reaches the allocation
  ASSERT_TRUE(Post(**c2, Op::kWrite, {{0, 0, 100}})->Wait(Deadline::After(1s)).ok());

  EXPECT_TRUE(b_.transport->Deregister(*b_.regions[1]).ok());
  EXPECT_EQ(Post(**c2, Op::kWrite, {{0, 0, 100}})->Wait(Deadline::After(1s)).code(), Code::kFailedPrecondition);
  EXPECT_EQ(api_.closes.load(), 1);
  // A new channel to a revoked region is refused before anything is mapped.
  EXPECT_EQ((*ep)->OpenChannel(a_.regions[0], r2).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(api_.opens.load(), 1);
}

TEST_F(CudaIpcProtocolTest, AFailedOpenIsReportedAndNotCached) {
  MemoryDesc remote;
  auto ep = ConnectWhole(&remote);
  ASSERT_TRUE(ep);
  // As cudaIpcOpenMemHandle reports a handle it cannot map (e.g. cudaErrorInvalidResourceHandle).
  api_.open_failure = Status(Code::kInternal, "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle");
  auto ch = ep->OpenChannel(a_.regions[0], remote);
  EXPECT_EQ(ch.status().code(), Code::kInternal);
  EXPECT_EQ(api_.opens.load(), 0);
  api_.open_failure = Status(Code::kResourceExhausted, "cudaIpcOpenMemHandle: cudaErrorMemoryAllocation");
  EXPECT_EQ(ep->OpenChannel(a_.regions[0], remote).status().code(), Code::kResourceExhausted);
  api_.open_failure = Status::Ok();
  EXPECT_TRUE(ep->OpenChannel(a_.regions[0], remote).ok());
  EXPECT_EQ(api_.opens.load(), 1);
}

TEST_F(CudaIpcProtocolTest, DeregistrationWaitsForAPeersBatchInFlight) {
  MemoryDesc remote;
  auto ep = ConnectWhole(&remote);
  ASSERT_TRUE(ep);
  auto ch = ep->OpenChannel(a_.regions[0], remote);
  ASSERT_TRUE(ch.ok());
  std::memset(a_.buf.data(), 0x5a, kBytes);
  gate_->closed = true;
  auto t = Post(**ch, Op::kWrite, {{0, 0, kBytes}});
  EXPECT_FALSE(t->Test());
  std::atomic<bool> returned{false};
  std::thread owner([&] {
    EXPECT_TRUE(b_.transport->Deregister(*b_.regions[0]).ok());
    returned = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(returned.load()) << "deregistration returned while a peer's copy was running";
  OpenGate(*gate_);
  owner.join();
  EXPECT_TRUE(returned.load());
  EXPECT_TRUE(t->Wait(Deadline::After(1s)).ok());
  EXPECT_EQ(b_.buf[kBytes - 1], 0x5a);
  // After deregistration, nothing more lands in the region.
  std::memset(b_.buf.data(), 0, kBytes);
  EXPECT_EQ(Post(**ch, Op::kWrite, {{0, 0, 64}})->Wait(Deadline::After(1s)).code(), Code::kFailedPrecondition);
  EXPECT_EQ(b_.buf[0], 0);
}

TEST_F(CudaIpcProtocolTest, ReachOnlyOtherProcessesOfThisHost) {
  EXPECT_FALSE(a_.transport->CanReach(Describe(a_)));  // the same process token
  EngineDesc far = Describe(b_);
  far.host_id = "another-host/boot";
  EXPECT_FALSE(a_.transport->CanReach(far));
  EXPECT_EQ(a_.transport->Connect(far).status().code(), Code::kUnavailable);
  EngineDesc none;
  none.key = "x";
  none.host_id = LocalHostId();
  EXPECT_FALSE(a_.transport->CanReach(none));
  EXPECT_FALSE(a_.transport->caps().notifications);
  EXPECT_FALSE(a_.transport->caps().host_memory);
}

TEST_F(CudaIpcProtocolTest, RegistrationChecksTheMemory) {
  auto make = [&](std::byte* base, MemoryKind kind) { return TestRegion(base, 16, next_region_++, kind); };
  auto* buf = reinterpret_cast<std::byte*>(a_.buf.data());
  EXPECT_EQ(a_.transport->Register(make(buf, MemoryKind::kHost)).status().code(), Code::kUnsupported);
  // Runs past the end of its allocation.
  EXPECT_EQ(a_.transport->Register(make(buf + kBytes - 8, MemoryKind::kCuda)).status().code(),
            Code::kInvalidArgument);
  std::vector<uint8_t> stray(64);  // not an allocation the api knows
  EXPECT_EQ(a_.transport->Register(make(reinterpret_cast<std::byte*>(stray.data()), MemoryKind::kCuda)).status().code(),
            Code::kInvalidArgument);
}

TEST_F(CudaIpcProtocolTest, ChannelsCheckTheRemoteDescriptor) {
  MemoryDesc remote;
  auto ep = ConnectWhole(&remote);
  ASSERT_TRUE(ep);
  MemoryDesc wrong = remote;
  wrong.region = RegionId{777};
  EXPECT_EQ(ep->OpenChannel(a_.regions[0], wrong).status().code(), Code::kInvalidArgument);
  wrong = remote;
  wrong.size = kBytes + 1;  // larger than its allocation
  EXPECT_EQ(ep->OpenChannel(a_.regions[0], wrong).status().code(), Code::kInvalidArgument);
  wrong = remote;
  wrong.engine_key = "someone-else";
  EXPECT_EQ(ep->OpenChannel(a_.regions[0], wrong).status().code(), Code::kInvalidArgument);
  wrong = remote;
  wrong.access.clear();
  EXPECT_EQ(ep->OpenChannel(a_.regions[0], wrong).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ep->Notify("hi").code(), Code::kUnsupported);
  EXPECT_EQ(api_.opens.load(), 0);
}

}  // namespace
}  // namespace ferry::internal::cuda_ipc
