#include "engine/op_check.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/thread_pool.h"  // StartThread
#include "transport/region.h"

namespace ferry::internal {
namespace {

// Ops per share: large enough that claiming one costs nothing beside it, small enough that a
// batch spreads over every thread.
constexpr size_t kChunkOps = 4096;
constexpr int kMaxCheckThreads = 8;

// One share's findings; the joins across shares are counted when they are combined.
struct ChunkResult {
  uint64_t total = 0;
  uint64_t joins = 0;
  uint64_t max_size = 0;
  bool ok = true;
  bool any = false;  // a non-empty op was seen
  uint64_t first_local = 0, first_remote = 0;  // the first non-empty op's start
  uint64_t last_local_end = 0, last_remote_end = 0;
};

// One load of each field of a caller's op. The caller's array may be changed by another thread
// while it is read (a hostile or careless caller): a plain copy lets the compiler load a field
// again for the check after storing the copy (the race makes that legal), so the check could
// pass on a value that the copy does not hold. Seen with g++ 13 on a 16-core machine: a write
// landed 512 KiB past its region (Conformance.OpsChangedByAnotherThreadNeverMoveUncheckedBytes).
inline TransferOp LoadOnce(const TransferOp& op) {
  return TransferOp{__atomic_load_n(&op.local_offset, __ATOMIC_RELAXED),
                    __atomic_load_n(&op.remote_offset, __ATOMIC_RELAXED), __atomic_load_n(&op.size, __ATOMIC_RELAXED)};
}

ChunkResult CheckChunk(const TransferOp* in, TransferOp* out, size_t n, uint64_t local_size, uint64_t remote_size) {
  ChunkResult r;
  for (size_t i = 0; i < n; ++i) {
    const TransferOp o = in == out ? in[i] : LoadOnce(in[i]);
    out[i] = o;  // what is checked is the copy the transport will get
    const bool inside = InBounds(o.local_offset, o.size, local_size) && InBounds(o.remote_offset, o.size, remote_size);
    const bool overflow = __builtin_add_overflow(r.total, o.size, &r.total);
    if (!inside || overflow) [[unlikely]] {
      r.ok = false;
      return r;  // the caller reports the first offending op; nothing else matters then
    }
    if (o.size == 0) {
      ++r.joins;
      continue;
    }
    r.max_size = std::max(r.max_size, o.size);
    if (!r.any) {
      r.any = true;
      r.first_local = o.local_offset;
      r.first_remote = o.remote_offset;
    } else if (o.local_offset == r.last_local_end && o.remote_offset == r.last_remote_end) {
      ++r.joins;
    }
    r.last_local_end = o.local_offset + o.size;
    r.last_remote_end = o.remote_offset + o.size;
  }
  return r;
}

// Shares claimed one at a time by the caller and the checking threads; kept alive by each thread
// that may still look at it (a helper that wakes after the batch was done finds nothing left).
struct Job {
  const TransferOp* in;
  TransferOp* out;
  size_t n;
  uint64_t local_size, remote_size;
  size_t chunks;
  std::vector<ChunkResult> results;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};

  void Work() {
    for (;;) {
      const size_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const size_t begin = c * kChunkOps, len = std::min(kChunkOps, n - begin);
      results[c] = CheckChunk(in + begin, out + begin, len, local_size, remote_size);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// The process's checking threads. A batch is published as the current job and one notify wakes
// every thread (one futex call); each then claims shares until none is left. A task queue, as
// before, took a lock and made a wake-up call per helper on the posting thread, one after the
// other, and its helpers then queued on that lock. Two batches checked at once share the
// threads: a helper works on the job that is current when it wakes, and each caller finishes
// its own job's shares itself when no helper comes.
class Checkers {
 public:
  // Null when no thread could start (the caller then checks alone).
  static Checkers* Get() {
    static Checkers* checkers = [] {
      const unsigned cores = std::thread::hardware_concurrency();
      const int want = std::min<int>(kMaxCheckThreads, cores > 2 ? static_cast<int>(cores) / 2 : 1);
      auto* c = new Checkers();  // never destroyed: a batch may be checked while the process exits
      for (int i = 0; i < want; ++i) {
        auto t = StartThread("ferry-opcheck-" + std::to_string(i), [c] { c->Loop(); });
        if (!t.ok()) break;
        t->detach();
        ++c->threads_;
      }
      if (c->threads_ == 0) {
        delete c;
        c = nullptr;
      }
      return c;
    }();
    return checkers;
  }

  // Makes `job` the current one and wakes every thread.
  void Publish(std::shared_ptr<Job> job) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      job_ = std::move(job);
    }
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }

 private:
  void Loop() EXCLUDES(mu_) {
    uint32_t seen = 0;
    for (;;) {
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      std::shared_ptr<Job> job;
      {
        MutexLock lock(&mu_);
        job = job_;
      }
      if (job) job->Work();
    }
  }

  int threads_ = 0;  // counted before Get() returns, then fixed
  std::atomic<uint32_t> generation_{0};  // 32 bits: a futex word (wrapping is harmless)
  Mutex mu_;
  std::shared_ptr<Job> job_ GUARDED_BY(mu_);  // the batch published last (kept until the next)
};

}  // namespace

OpCheck CopyAndCheckOps(std::span<const TransferOp> in, TransferOp* out, uint64_t local_size,
                        uint64_t remote_size) {
  const size_t n = in.size();
  Checkers* checkers = n >= kParallelCheckOps ? Checkers::Get() : nullptr;
  std::vector<ChunkResult> results;
  if (checkers == nullptr) {
    ChunkResult r = CheckChunk(in.data(), out, n, local_size, remote_size);
    results.push_back(r);
  } else {
    auto job = std::make_shared<Job>();
    job->in = in.data();
    job->out = out;
    job->n = n;
    job->local_size = local_size;
    job->remote_size = remote_size;
    job->chunks = (n + kChunkOps - 1) / kChunkOps;
    job->results.resize(job->chunks);
    checkers->Publish(job);
    job->Work();
    // Every share is claimed; the ones other threads hold are a few microseconds of work that
    // is already running, so this wait ends without a deadline of its own.
    while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
    results = std::move(job->results);
  }
  OpCheck check;
  bool any = false;
  uint64_t local_end = 0, remote_end = 0;
  for (const ChunkResult& r : results) {
    if (!r.ok || __builtin_add_overflow(check.total, r.total, &check.total)) {
      check.ok = false;
      return check;
    }
    check.joins += r.joins;
    check.max_size = std::max(check.max_size, r.max_size);
    if (!r.any) continue;
    if (any && r.first_local == local_end && r.first_remote == remote_end) ++check.joins;
    any = true;
    local_end = r.last_local_end;
    remote_end = r.last_remote_end;
  }
  return check;
}

}  // namespace ferry::internal
