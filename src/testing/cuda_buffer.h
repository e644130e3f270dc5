// Helpers of the CUDA tests, below the engine: host or device buffers, scattered ops and their
// check, and skipping (with the reason) where no GPU is usable. Links ferry_cuda.
// Thread safety: a Buffer is used by one thread at a time; the functions are pure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "cuda/copy_engine.h"
#include "cuda/runtime.h"
#include "ferry/descriptors.h"
#include "ferry/types.h"
#include "testing/bytes.h"

namespace ferry::cuda_testing {

using ::ferry::testing::RandomBytes;

struct Loc {
  MemoryKind kind;
  int device;  // -1 for host memory
};
constexpr Loc kHostLoc{MemoryKind::kHost, -1};
constexpr Loc kGpu0{MemoryKind::kCuda, 0};
constexpr Loc kGpu1{MemoryKind::kCuda, 1};

// Host memory (16-byte aligned by new[]) or memory of one CUDA device.
class Buffer {
 public:
  static std::unique_ptr<Buffer> Make(Loc loc, size_t size) {
    auto b = std::unique_ptr<Buffer>(new Buffer(loc, size));
    if (loc.kind == MemoryKind::kHost) {
      b->host_.reset(new uint8_t[size]());
      b->ptr_ = b->host_.get();
    } else {
      auto p = cuda::Malloc(loc.device, size);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return nullptr;
      b->ptr_ = *p;
      EXPECT_TRUE(cuda::MemsetSync(b->ptr_, 0, size).ok());
    }
    return b;
  }
  ~Buffer() {
    if (loc_.kind == MemoryKind::kCuda && ptr_ != nullptr) (void)cuda::Free(ptr_);
  }
  void Upload(const std::vector<uint8_t>& data) {
    ASSERT_EQ(data.size(), size_);
    ASSERT_TRUE(cuda::CopySync(ptr_, data.data(), size_).ok());
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(size_);
    EXPECT_TRUE(cuda::CopySync(out.data(), ptr_, size_).ok());
    return out;
  }
  void* ptr() const { return ptr_; }
  size_t size() const { return size_; }
  Loc loc() const { return loc_; }

 private:
  Buffer(Loc loc, size_t size) : loc_(loc), size_(size) {}
  Loc loc_;
  size_t size_;
  void* ptr_ = nullptr;
  std::unique_ptr<uint8_t[]> host_;
};

// `count` pieces of 1..max_piece bytes at random (so mostly misaligned) offsets, one per slot
// on each side, the remote slots shuffled; no two pieces overlap on either side.
inline std::vector<TransferOp> Scattered(size_t region, size_t count, size_t max_piece, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t slot = region / count;
  std::vector<size_t> remote_slots(count);
  std::iota(remote_slots.begin(), remote_slots.end(), 0);
  std::shuffle(remote_slots.begin(), remote_slots.end(), rng);
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t size = 1 + rng() % std::min(max_piece, slot);
    ops.push_back({i * slot + rng() % (slot - size + 1), remote_slots[i] * slot + rng() % (slot - size + 1), size});
  }
  return ops;
}

// Checks that every op moved its bytes from `src` to `dst` (write: local -> remote).
inline void ExpectApplied(const std::vector<uint8_t>& src, const std::vector<uint8_t>& dst,
                   const std::vector<TransferOp>& ops, bool write) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const TransferOp& op = ops[i];
    const uint64_t s = write ? op.local_offset : op.remote_offset;
    const uint64_t d = write ? op.remote_offset : op.local_offset;
    ASSERT_EQ(std::memcmp(src.data() + s, dst.data() + d, op.size), 0)
        << "op " << i << " (" << op.local_offset << ", " << op.remote_offset << ", " << op.size << ")";
  }
}

inline bool SkipWithoutCuda(int gpus, std::string* why) {
  if (!cuda::Available()) {
    *why = cuda::UnavailableReason();
    return true;
  }
  if (cuda::DeviceCount() < gpus) {
    *why = "needs " + std::to_string(gpus) + " CUDA devices, found " + std::to_string(cuda::DeviceCount());
    return true;
  }
  return false;
}

#if FERRY_HAVE_CUDA
// A copy engine batch's status once it completes, polling for up to 30 s (kInProgress after that).
inline Status WaitDone(const std::shared_ptr<cuda::Completion>& c) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!c->Test() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  return c->status();
}
#endif

#define FERRY_SKIP_WITHOUT_CUDA(gpus)                   \
  do {                                                  \
    std::string why_;                                   \
    if (::ferry::cuda_testing::SkipWithoutCuda(gpus, &why_)) GTEST_SKIP() << why_; \
  } while (0)

}  // namespace ferry::cuda_testing
