// The staged path's shared pieces (staged.h), for its two halves: staged.cc (the initiator's
// jobs, the copier, Stager) and staged_target.cc (the target's scatter and gather). Not for
// other users.
//
// Bounce buffers: a pool holds at most kStageBuffers page-locked buffers of kBounceBytes; a
// Bounce returns its buffer to the pool when the last holder lets it go (or frees it once the
// pool is gone). Thread safety: BouncePool and Dispatcher are thread-safe; Stager::Impl's
// members are used on progress threads as staged.h says.
#pragma once

#include <atomic>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "cuda/runtime.h"
#include "transport/ucx/core.h"
#include "transport/ucx/staged.h"

namespace ferry::internal::ucx {

inline constexpr size_t kBounceBytes = (kStageChunkBytes + PieceTableBytes(kStageMaxPieces) + 4095) / 4096 * 4096;

// Runs work on a shard's progress thread while the transport lives.
class Dispatcher {
 public:
  // From Stager's construction to its end: Run() reaches `core`'s shards.
  void Attach(Core* core) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    core_ = core;
  }
  // Run() fails from now on (the transport is going).
  void Detach() EXCLUDES(mu_) { Attach(nullptr); }
  // False when detached or the shard's worker is stopping; then `fn` does not run.
  bool Run(size_t shard, std::function<void()> fn) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return core_ != nullptr && core_->shard(shard).worker->Submit(std::move(fn));
  }

 private:
  Mutex mu_;
  Core* core_ GUARDED_BY(mu_) = nullptr;
};

class BouncePool;

// Heap bounce buffers (AnyBuffer) outstanding at once, per engine. A peer that holds a
// region's descriptor could otherwise post staged writes in rendezvous without end and make
// this engine hold a 4 MiB buffer for each until its data arrives. 256 MiB is 64 chunks in
// flight, more than a few peers' pipelines need (each keeps kStageBuffers chunks in flight);
// a chunk past it is answered kResourceExhausted, which fails the initiator's transfer.
inline constexpr size_t kMaxHeapBounceBytes = size_t{256} << 20;

// Bytes of heap bounce buffers taken, against a limit. Thread-safe.
class HeapBudget {
 public:
  explicit HeapBudget(size_t limit) : limit_(limit) {}
  bool Take(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > limit_.load(std::memory_order_relaxed)) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void Give(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  void set_limit(size_t limit) { limit_.store(limit, std::memory_order_relaxed); }  // tests

 private:
  std::atomic<size_t> used_{0};
  std::atomic<size_t> limit_;
};

// A bounce buffer in use; back to its pool (or, from the heap, freed and its bytes given back
// to `budget`) when the last holder lets go.
struct Bounce {
  Bounce(std::weak_ptr<BouncePool> pool, std::byte* data, bool pinned, std::shared_ptr<HeapBudget> budget = nullptr)
      : pool(std::move(pool)), data(data), pinned(pinned), budget(std::move(budget)) {}
  Bounce(const Bounce&) = delete;
  ~Bounce();
  std::weak_ptr<BouncePool> pool;
  std::byte* const data;
  const bool pinned;  // page-locked and mapped: GPU kernels reach it
  const std::shared_ptr<HeapBudget> budget;
};

inline void FreeBuffer(std::byte* data, bool pinned) {
  if (pinned) (void)cuda::HostUnregister(data);
  std::free(data);
}

class BouncePool : public std::enable_shared_from_this<BouncePool> {
 public:
  BouncePool(std::shared_ptr<Dispatcher> dispatch, bool pin) : dispatch_(std::move(dispatch)), pin_(pin) {}
  ~BouncePool() {
    for (auto& [data, pinned] : free_) FreeBuffer(data, pinned);
  }
  // A buffer, or null when all kStageBuffers are in use; then `retry` runs on the progress
  // thread of `shard` once one comes back (registered under the same lock as the check, so that a
  // buffer returned meanwhile on another thread is not missed).
  std::shared_ptr<Bounce> AcquireOrWait(size_t shard, std::function<void()> retry) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto b = TryAcquireLocked();
    if (!b && retry) waiters_.emplace_back(shard, std::move(retry));
    return b;
  }
  std::shared_ptr<Bounce> TryAcquire() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return TryAcquireLocked();
  }
  void Return(std::byte* data, bool pinned) EXCLUDES(mu_) {
    std::pair<size_t, std::function<void()>> next;
    {
      MutexLock lock(&mu_);
      free_.emplace_back(data, pinned);
      if (!waiters_.empty()) {
        next = std::move(waiters_.front());
        waiters_.pop_front();
      }
    }
    if (next.second) (void)dispatch_->Run(next.first, std::move(next.second));
  }
  void DropWaiters() EXCLUDES(mu_) {
    std::deque<std::pair<size_t, std::function<void()>>> w;  // destroyed after the lock is let go
    MutexLock lock(&mu_);
    w.swap(waiters_);
  }
  size_t free() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return free_.size();
  }
  size_t allocated() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return allocated_;
  }

 private:
  std::shared_ptr<Bounce> TryAcquireLocked() REQUIRES(mu_) {
    if (!free_.empty()) {
      auto [data, pinned] = free_.back();
      free_.pop_back();
      return std::make_shared<Bounce>(weak_from_this(), data, pinned);
    }
    if (allocated_ >= kStageBuffers) return nullptr;
    auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, kBounceBytes));
    if (data == nullptr) return nullptr;
    const bool pinned = pin_ && cuda::HostRegister(data, kBounceBytes).ok();
    ++allocated_;
    return std::make_shared<Bounce>(weak_from_this(), data, pinned);
  }

  std::shared_ptr<Dispatcher> dispatch_;
  const bool pin_;
  Mutex mu_;
  std::vector<std::pair<std::byte*, bool>> free_ GUARDED_BY(mu_);
  std::deque<std::pair<size_t, std::function<void()>>> waiters_ GUARDED_BY(mu_);  // shard, retry
  size_t allocated_ GUARDED_BY(mu_) = 0;
};

inline Bounce::~Bounce() {
  if (budget) {
    FreeBuffer(data, pinned);
    budget->Give(kBounceBytes);
  } else if (auto p = pool.lock()) {
    p->Return(data, pinned);
  } else {
    FreeBuffer(data, pinned);
  }
}

// A buffer for one message: from the pool, or (pool exhausted, or a target of host memory)
// plain heap memory that only the DMA engines reach, within `budget`. Null when neither is
// to be had (the caller answers kResourceExhausted).
inline std::shared_ptr<Bounce> AnyBuffer(BouncePool* pool, const std::shared_ptr<HeapBudget>& budget) {
  if (pool != nullptr) {
    if (auto b = pool->TryAcquire()) return b;
  }
  if (!budget->Take(kBounceBytes)) return nullptr;
  auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, kBounceBytes));
  if (data == nullptr) {
    budget->Give(kBounceBytes);
    return nullptr;
  }
  return std::make_shared<Bounce>(std::weak_ptr<BouncePool>(), data, false, budget);
}

using GpuCopy = StageCopy;

using GpuCopy = StageCopy;

struct Stager::Impl : std::enable_shared_from_this<Stager::Impl> {
  Core* core = nullptr;
  std::shared_ptr<Dispatcher> dispatch = std::make_shared<Dispatcher>();
  std::shared_ptr<BouncePool> send_pool, recv_pool;
  std::shared_ptr<HeapBudget> heap = std::make_shared<HeapBudget>(kMaxHeapBounceBytes);
  std::unique_ptr<StageCopier> copier;  // progress thread (and ~Stager, once it stopped)
  bool has_gpu = false;

  bool gpu() const { return has_gpu; }

  Status Copy(int device, const std::vector<GpuCopy>& copies, bool pinned, std::function<void(const Status&)> done) {
    if (!copier) return Status(Code::kAborted, "the ucx transport was shut down");
    return copier->Copy(device, copies, pinned, std::move(done));
  }

  // Progress thread of `s`, which received the request on `reply` (an accepted connection,
  // unless the peer closed it meanwhile).
  void SendAckIfOpen(Shard& s, Reply reply, uint64_t token, Code code) {
    s.SendAck(reply.conn, reply.lane, token, code);
  }

  // Target side, progress thread of `s`: scatters a received chunk (in `buf`, `length` bytes)
  // into `region`, then acks.
  void Scatter(Shard& s, const std::shared_ptr<RegionUse>& hold, std::shared_ptr<Bounce> buf, size_t length,
               Reply reply, uint64_t token);
  // Target side, progress thread of `s`: gathers `pieces` of `region` and answers `token` with them.
  void Gather(Shard& s, const std::shared_ptr<RegionUse>& hold, std::vector<StagedPiece> pieces, uint64_t total,
              Reply reply, uint64_t token);
};

}  // namespace ferry::internal::ucx
