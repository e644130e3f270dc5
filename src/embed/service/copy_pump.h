// CopyPump: issues the copies of a layer's gathered rows from one thread of its own, behind the
// gather. Gather threads only mark their chunk done (ChunkDone: a store, and a wake-up when the
// pump sleeps); the pump issues one copy of the longest contiguous run of finished chunks past
// what it issued, once that run holds at least min_tokens tokens or reaches the end, so the
// first copy starts after the first few chunks, the copies run while later chunks are gathered,
// and few large copies replace one per chunk (no gather thread waits on the copy stream).
//
// One layer at a time: Begin(), ChunkDone() for every chunk (any threads), then End(), which
// waits until the last copy was issued. End(complete = false) (the gather failed, some chunks
// will never be reported) stops the layer after the copy in progress.
//
// Thread safety: Create() starts the pump's thread (kResourceExhausted when it cannot start);
// Begin and End from one thread (the group's); ChunkDone from any thread between them. `issue`
// runs on the pump's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class CopyPump {
 public:
  // Copies tokens [begin, end) (to every destination); an error fails the layer.
  using Issue = std::function<Status(int64_t begin, int64_t end)>;

  static Result<std::unique_ptr<CopyPump>> Create();
  ~CopyPump();
  CopyPump(const CopyPump&) = delete;
  CopyPump& operator=(const CopyPump&) = delete;

  // REQUIRES: no layer in progress; num_tokens >= 1, chunk_tokens >= 1, min_tokens >= 1.
  void Begin(int64_t num_tokens, int64_t chunk_tokens, int64_t min_tokens, Issue issue)
      EXCLUDES(mu_);
  // REQUIRES: [begin, end) is one chunk of the layer (begin a multiple of chunk_tokens).
  void ChunkDone(int64_t begin, int64_t end) EXCLUDES(mu_);
  // Waits until every chunk's copy was issued (or, complete = false, the pump stopped), or
  // kDeadlineExceeded; then the first error `issue` returned. *last_issue: when the last copy
  // was issued (unchanged when none was).
  Status End(bool complete, Deadline deadline, Clock::time_point* last_issue) EXCLUDES(mu_);
  // Copies issued since construction (for tests and stats).
  uint64_t copies() const { return copies_.load(); }

 private:
  CopyPump() = default;
  void Loop() EXCLUDES(mu_);
  void RunLayer() EXCLUDES(mu_);
  bool Ready(int64_t chunk) const { return done_[chunk].load() != 0; }

  Mutex mu_;
  CondVar cv_;       // the pump waits here for a layer or for chunks
  CondVar done_cv_;  // End() waits here
  bool stopping_ GUARDED_BY(mu_) = false;
  bool active_ GUARDED_BY(mu_) = false;   // a layer was begun and is not finished
  bool finished_ GUARDED_BY(mu_) = true;  // the pump is done with the layer
  std::atomic<bool> cancel_{false};
  std::atomic<bool> sleeping_{false};
  // The layer, set by Begin() (under mu_) before the pump sees active_, then read by the pump
  // and ChunkDone without the lock until End(): not GUARDED_BY, ordered by mu_ and active_.
  int64_t num_tokens_ = 0, chunk_tokens_ = 1, min_tokens_ = 1, chunks_ = 0;
  Issue issue_;
  std::unique_ptr<std::atomic<uint8_t>[]> done_;
  size_t done_capacity_ = 0;
  Status result_ GUARDED_BY(mu_);
  Clock::time_point last_issue_ GUARDED_BY(mu_);
  bool issued_any_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> copies_{0};
  std::thread thread_;
};

}  // namespace ferry::embed::service
