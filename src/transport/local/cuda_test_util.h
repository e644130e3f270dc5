// Helpers of the CUDA tests of the local transport: host or device buffers, a pair of engines
// with a session between two buffers, scattered ops, and skipping where no GPU is usable.
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
#include "engine/test_util.h"
#include "ferry/system.h"

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

// Engines a and b (local transport only), a buffer registered with each, and a session from
// a's buffer to b's. Buffers are declared first so that they outlive the engines.
struct Pair {
  std::unique_ptr<Buffer> a_buf, b_buf;
  std::unique_ptr<Engine> a, b;
  MemoryDesc a_desc, b_desc;
  Session session;

  static std::unique_ptr<Pair> Make(Loc a_loc, Loc b_loc, size_t bytes, EngineOptions options = {}) {
    static std::atomic<int> counter{0};
    auto p = std::make_unique<Pair>();
    const std::string suffix = std::to_string(counter.fetch_add(1));
    options.transports = {"local"};
    options.key = "cuda-a" + suffix;
    auto a = Engine::Create(options);
    options.key = "cuda-b" + suffix;
    auto b = Engine::Create(options);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    p->a_buf = Buffer::Make(a_loc, bytes);
    p->b_buf = Buffer::Make(b_loc, bytes);
    if (!p->a_buf || !p->b_buf) return nullptr;
    p->a = std::move(a).value();
    p->b = std::move(b).value();
    auto ad = p->a->RegisterMemory(p->a_buf->ptr(), bytes, a_loc.kind, a_loc.device);
    auto bd = p->b->RegisterMemory(p->b_buf->ptr(), bytes, b_loc.kind, b_loc.device);
    EXPECT_TRUE(ad.ok()) << ad.status().ToString();
    EXPECT_TRUE(bd.ok()) << bd.status().ToString();
    if (!ad.ok() || !bd.ok()) return nullptr;
    p->a_desc = *ad;
    p->b_desc = *bd;
    EXPECT_TRUE(p->a->AddPeer(p->b->Describe()).ok());
    EXPECT_TRUE(p->b->AddPeer(p->a->Describe()).ok());
    auto s = p->a->OpenSession(p->a_desc, p->b_desc);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    p->session = *s;
    EXPECT_EQ(p->session.path().transport, "local");
    return p;
  }
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
  if (!CudaAvailable(why)) return true;
  if (cuda::DeviceCount() < gpus) {
    *why = "needs " + std::to_string(gpus) + " CUDA devices, found " + std::to_string(cuda::DeviceCount());
    return true;
  }
  return false;
}

#define FERRY_SKIP_WITHOUT_CUDA(gpus)                   \
  do {                                                  \
    std::string why_;                                   \
    if (::ferry::cuda_testing::SkipWithoutCuda(gpus, &why_)) GTEST_SKIP() << why_; \
  } while (0)

}  // namespace ferry::cuda_testing
