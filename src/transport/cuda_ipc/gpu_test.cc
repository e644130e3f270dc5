// The cuda_ipc transport on a GPU, in one process: real allocation ranges and IPC handles,
// the CUDA copier (CopyEngine: one kernel for small pieces, DMA for large), with only the
// opening of handles faked (a process cannot open its own handles; it gets its own pointer
// back). Isolates the copy path from the two-process tests in src/engine/cuda_process_test.cc.
// Skips where no GPU is usable.
#include <gtest/gtest.h>

#include "base/mutex.h"
#include "testing/cuda_buffer.h"
#include "testing/transport_link.h"
#include "transport/cuda_ipc/transport.h"

namespace ferry::internal::cuda_ipc {
namespace {

using namespace ::ferry::cuda_testing;  // NOLINT: test helpers
using namespace std::chrono_literals;

// Real CUDA calls, except that opening a handle returns the allocation it names in this process.
class SameProcessApi final : public cuda::IpcApi {
 public:
  Result<cuda::AllocationRange> GetAllocationRange(const void* ptr) override { return cuda::GetAllocationRange(ptr); }
  Result<cuda::IpcHandle> GetHandle(void* base) override {
    FERRY_ASSIGN_OR_RETURN(cuda::IpcHandle h, cuda::IpcGetHandle(base));
    MutexLock lock(&mu_);
    bases_.emplace_back(h, base);
    return h;
  }
  Result<void*> OpenHandle(const cuda::IpcHandle& h, int) override {
    MutexLock lock(&mu_);
    for (auto& [handle, base] : bases_)
      if (handle == h) return base;
    return Status(Code::kNotFound, "unknown handle");
  }
  Status CloseHandle(void*) override { return Status::Ok(); }

 private:
  Mutex mu_;
  std::vector<std::pair<cuda::IpcHandle, void*>> bases_ GUARDED_BY(mu_);
};

TEST(CudaIpcGpu, RealHandlesAndTheCopyEngine) {
  FERRY_SKIP_WITHOUT_CUDA(1);
  const size_t kBytes = 32 << 20;
  // One allocation holding two regions, and another for the local side.
  auto remote_buf = Buffer::Make(kGpu0, 2 * kBytes);
  auto local_buf = Buffer::Make(kGpu0, kBytes);
  ASSERT_TRUE(remote_buf && local_buf);
  auto range = cuda::GetAllocationRange(static_cast<std::byte*>(remote_buf->ptr()) + kBytes + 5);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(range->base, remote_buf->ptr());
  EXPECT_EQ(range->size, 2 * kBytes);
  // This process cannot open its own handle.
  auto own = cuda::IpcGetHandle(remote_buf->ptr());
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_FALSE(cuda::IpcOpenHandle(*own, 0).ok());

  SameProcessApi api;
  EngineOptions options;
  // One set of copy engines for both transports, as an engine hands them out.
  auto engines = std::make_shared<cuda::CopyEngines>();
  auto make = [&](const std::string& key, const std::string& token) {
    auto copier = MakeCudaCopier(engines);
    EXPECT_TRUE(copier.ok()) << copier.status().ToString();
    Seams seams{&api, std::move(copier).value(), token};
    TransportContext ctx{key, &options, std::make_shared<Inbox>(4, 64), engines};
    return MakeTransport(ctx, std::move(seams));
  };
  auto a = make("gpu-a", "1:a");
  auto b = make("gpu-b", "2:b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto local = TestRegion(local_buf->ptr(), kBytes, 1, MemoryKind::kCuda);
  auto remote = TestRegion(static_cast<std::byte*>(remote_buf->ptr()) + kBytes, kBytes, 2,
                           MemoryKind::kCuda);  // second half
  auto link = OpenLink(**a, **b, "gpu-b", local, remote);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  Channel& ch = *link->channel;

  auto data = RandomBytes(kBytes, 3);
  local_buf->Upload(data);
  remote_buf->Upload(std::vector<uint8_t>(2 * kBytes, 0));
  auto ops = Scattered(kBytes, 20000, 1500, 4);
  ops.push_back({0, 0, 0});  // empty pieces are skipped
  for (Op op : {Op::kWrite, Op::kRead}) {
    if (op == Op::kRead) local_buf->Upload(std::vector<uint8_t>(kBytes, 0));
    auto state = PostBatch(ch, op, ops, 30s);
    ASSERT_TRUE(state->Wait(Deadline::After(30s)).ok()) << state->status().ToString();
    auto whole = remote_buf->Download();
    std::vector<uint8_t> second(whole.begin() + kBytes, whole.end());
    if (op == Op::kWrite) ExpectApplied(data, second, ops, true);
    else ExpectApplied(second, local_buf->Download(), ops, false);
    // The first half of the allocation is untouched.
    EXPECT_EQ(std::count(whole.begin(), whole.begin() + kBytes, 0), static_cast<long>(kBytes));
  }
  // The write and the read (20,000 pieces each) went to the shared set: kernels, no DMA call.
  cuda::CopyStats st = engines->stats();
  EXPECT_EQ(st.kernel_pieces, 40000u);
  EXPECT_GE(st.kernel_launches, 2u);
  EXPECT_EQ(st.dma_calls, 0u);
  EXPECT_TRUE((*b)->Deregister(*remote).ok());
  auto state = std::make_shared<TransferState>(TransferId{2}, 64, ch.path(), Deadline::After(5s));
  EXPECT_EQ(ch.Post(Op::kWrite, std::vector<TransferOp>{{0, 0, 64}}, 64, state).code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace ferry::internal::cuda_ipc
