// CopyPump: issues the copies of a layer's gathered rows from one thread of its own, behind the
// gather. Gather threads only mark their chunk done (ChunkDone: a store, and a wake-up when the
// pump sleeps); the pump issues one copy of the longest contiguous run of finished chunks past
// what it issued, once that run holds at least min_tokens tokens or reaches the end, so the
// first copy starts after the first few chunks, the copies run while later chunks are gathered,
// and few large copies replace one per chunk (no gather thread waits on the copy stream).
//
// Up to kDepth layers are in flight at once, served strictly in the order they were begun: the
// group's thread begins layer k + 1 and gathers it while the pump still issues layer k's last
// copies. After a layer's last copy the pump runs its `complete` callback (the service sets the
// layer's DONE there, ordered behind the copies), so DONE follows the layer order and never
// waits for the next layer's gather.
//
// Begin() -> ticket, ChunkDone(ticket, ...) for every chunk (any threads), then End(ticket),
// which waits until the layer's last copy was issued and `complete` ran. End(complete = false)
// (the gather failed: some chunks will never be reported) stops the layer after the copy in
// progress, and `complete` does not run. Every wait has a deadline: End's, then kStuckGrace for
// a copy call that does not return; a pump that stays stuck refuses later layers
// (kUnavailable) so that its caller stops reusing the buffers the copy may still read.
//
// Thread safety: Create() starts the pump's thread (kResourceExhausted when it cannot start);
// Begin and End from one thread (the group's), layers ended in the order begun; ChunkDone from
// any thread between its layer's Begin and End. `issue` and `complete` run on the pump's thread.
#pragma once

#include <sched.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class CopyPump {
 public:
  // Copies tokens [begin, end) (to every destination); an error fails the layer.
  using Issue = std::function<Status(int64_t begin, int64_t end)>;
  // After the layer's last copy was issued without error; an error fails the layer.
  using Complete = std::function<Status()>;
  using Ticket = uint64_t;

  static constexpr int kDepth = 2;
  static constexpr std::chrono::seconds kStuckGrace{5};

  // `cpus`: the CPUs the pump's thread runs on (empty: wherever the scheduler puts it). A set
  // the kernel refuses leaves the thread unpinned (affinity is an optimisation, never an error).
  static Result<std::unique_ptr<CopyPump>> Create(std::vector<int> cpus = {});
  ~CopyPump();
  CopyPump(const CopyPump&) = delete;
  CopyPump& operator=(const CopyPump&) = delete;

  // REQUIRES: num_tokens >= 1, chunk_tokens >= 1, min_tokens >= 1. kFailedPrecondition when
  // kDepth layers are in flight; kUnavailable when the pump is stuck in a copy call.
  Result<Ticket> Begin(int64_t num_tokens, int64_t chunk_tokens, int64_t min_tokens, Issue issue,
                       Complete complete = nullptr) EXCLUDES(mu_);
  // REQUIRES: [begin, end) is one chunk of the layer (begin a multiple of chunk_tokens).
  void ChunkDone(Ticket ticket, int64_t begin, int64_t end) EXCLUDES(mu_);
  // Waits until the layer's copies were issued and `complete` ran (or, complete = false, the
  // pump stopped the layer), or kDeadlineExceeded; then the first error of `issue` or
  // `complete`. *last_issue: when the last copy was issued (unchanged when none was);
  // *completed: when `complete` returned (unchanged when it did not run).
  Status End(Ticket ticket, bool complete, Deadline deadline, Clock::time_point* last_issue,
             Clock::time_point* completed = nullptr) EXCLUDES(mu_);
  // Layers begun and not ended.
  int in_flight() const EXCLUDES(mu_);
  // Copies issued since construction (for tests and stats).
  uint64_t copies() const { return copies_.load(); }
  // The CPUs the thread was pinned to (empty: not pinned).
  const std::vector<int>& cpus() const { return pinned_; }

 private:
  // One layer in flight. Its fields are set by Begin() (under mu_) before the pump can see the
  // ticket, then read by the pump and ChunkDone without the lock until End(): not GUARDED_BY,
  // ordered by mu_ and begun_.
  struct Layer {
    int64_t num_tokens = 0, chunk_tokens = 1, min_tokens = 1, chunks = 0;
    Issue issue;
    Complete complete;
    std::unique_ptr<std::atomic<uint8_t>[]> done;
    size_t done_capacity = 0;
    std::atomic<bool> cancel{false};
    // Under mu_ (the pump writes them when it finishes the layer).
    bool finished = true;
    bool ran_complete = false;
    Status result;
    Clock::time_point last_issue{}, completed{};
    bool issued_any = false;
  };

  CopyPump() = default;
  void Loop() EXCLUDES(mu_);
  void RunLayer(Layer& l) EXCLUDES(mu_);
  Layer& At(Ticket t) { return layers_[t % kDepth]; }
  static bool Ready(const Layer& l, int64_t chunk) { return l.done[chunk].load() != 0; }

  mutable Mutex mu_;
  CondVar cv_;       // the pump waits here for a layer or for chunks
  CondVar done_cv_;  // End() waits here
  bool stopping_ GUARDED_BY(mu_) = false;
  bool stuck_ GUARDED_BY(mu_) = false;
  Ticket begun_ GUARDED_BY(mu_) = 0;    // layers begun: tickets [0, begun_)
  Ticket ended_ GUARDED_BY(mu_) = 0;    // layers ended: tickets [0, ended_)
  Ticket serving_ GUARDED_BY(mu_) = 0;  // the pump's next layer
  std::atomic<bool> sleeping_{false};
  std::array<Layer, kDepth> layers_;
  std::atomic<uint64_t> copies_{0};
  std::vector<int> pinned_;
  std::thread thread_;
};

// The CPUs this process may run on (sched_getaffinity), ascending; empty when unknown.
std::vector<int> AllowedCpus();
// Pins the calling thread to `cpus`; false (and nothing changed) when the kernel refuses.
bool PinThisThread(const std::vector<int>& cpus);

}  // namespace ferry::embed::service
