// CopyParallel (host_copy.h): parts of a batch copy exactly, and a transfer that ends while a
// large op is being copied stops it within a few MiB instead of copying on for nobody.
#include "transport/host_copy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "transport/transfer_state.h"

namespace ferry::internal {
namespace {

std::shared_ptr<TransferState> NewState(uint64_t bytes) {
  return std::make_shared<TransferState>(TransferId{}, bytes, TransferPath{}, Deadline::After(std::chrono::seconds(30)));
}

TEST(CopyParallel, PartsCopyEveryByteOfScatteredAndLargeOps) {
  const uint64_t kBytes = 24 << 20;
  std::vector<std::byte> local(kBytes), remote(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) local[i] = static_cast<std::byte>(i * 131 + 7);
  // One op of 9 MiB (several checks inside it), then small ones, none overlapping.
  std::vector<TransferOp> ops = {{0, 12 << 20, 9 << 20}};
  for (uint64_t k = 0; k < 300; ++k) ops.push_back({(10 << 20) + k * 1000, k * 1000 + 7, 999});
  uint64_t total = 0;
  for (const auto& o : ops) total += o.size;
  ThreadPool pool(3, "copy-test");
  auto state = NewState(total);
  CopyParallel(&pool, local.data(), remote.data(), ops, total, /*write=*/true, state);
  state->PartDone(Status::Ok());  // the poster's part
  ASSERT_TRUE(state->Wait(Deadline::After(std::chrono::seconds(30))).ok());
  for (const auto& o : ops)
    ASSERT_EQ(std::memcmp(remote.data() + o.remote_offset, local.data() + o.local_offset, o.size), 0) << o.local_offset;
}

TEST(CopyParallel, AnEndedTransferStopsInsideALargeOp) {
  // 256 MiB take one thread 15 ms or more: the transfer ends 2 ms in, while the op is copied
  // (or, on a slow start, before it is: then nothing is copied at all).
  const uint64_t kBytes = 256ull << 20;
  std::vector<std::byte> local(kBytes, std::byte{0xab}), remote(kBytes);  // both touched
  std::vector<TransferOp> ops = {{0, 0, kBytes}};
  auto state = NewState(kBytes);
  {
    ThreadPool pool(1, "copy-test");
    CopyParallel(&pool, local.data(), remote.data(), ops, kBytes, /*write=*/true, state);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    state->Finish(Status(Code::kUnavailable, "the peer went away"));
  }  // the pool drains: the part has returned
  EXPECT_EQ(remote[kBytes - 1], std::byte{0}) << "the part copied the whole op for an ended transfer";
}

}  // namespace
}  // namespace ferry::internal
