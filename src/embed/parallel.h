// RunOnWorkers: runs fn(0) .. fn(workers - 1) concurrently, fn(0) on the calling thread and
// the others on a ThreadPool, and returns when all have returned. The functions share work
// among themselves (an atomic cursor), so a busy pool only delays, never loses, work.
//
// Thread safety: may be called from any thread except a worker of `pool` itself (it would
// wait for tasks queued behind it).
#pragma once

#include <functional>
#include <latch>

#include "base/thread_pool.h"

namespace ferry::embed {

inline void RunOnWorkers(ThreadPool* pool, int workers, const std::function<void(int)>& fn) {
  if (pool == nullptr || workers <= 1) {
    fn(0);
    return;
  }
  std::latch done(workers - 1);
  for (int w = 1; w < workers; ++w) {
    pool->Submit([&fn, &done, w] {
      fn(w);
      done.count_down();
    });
  }
  fn(0);
  done.wait();
}

}  // namespace ferry::embed
