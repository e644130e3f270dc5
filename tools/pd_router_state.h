// What `ferry pd`'s router knows of its workers, instances and requests (pd_router.cc).
//
// Thread safety: plain values, owned by the router's one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "pd_alloc.h"
#include "pd_config.h"
#include "pd_procs.h"
#include "pd_summary.h"

namespace ferry::tools::pd {

struct WorkerState {
  WorkerConfig cfg;
  std::string id;  // "p0/dp0/tp1"
  size_t instance = 0;
  ChildProcess proc;
  bool alive = true;
  bool ready = false;
  bool peered = false;
  bool final = false;
  std::string addr;
  WorkerRecord rec;
};

// One DP rank of an instance: its TP workers and its scheduler's blocks (each DP rank of vLLM
// runs its own scheduler and KV cache).
struct InstanceState {
  bool prefill = true;
  std::string name;  // the instance's ("p0"), shared by its DP ranks
  uint32_t dp = 0;
  uint32_t block_tokens = 16;
  std::vector<size_t> workers;
  BlockAllocator blocks{0};
  bool broken =
      false;  // a worker of this DP rank died: no new requests, its blocks are not counted
};

struct RequestState {
  uint64_t n = 0;
  std::string id;
  uint64_t tokens = 0;
  uint64_t first_token = 0;  // the decode side's prefix hit: tokens before it do not move
  bool running = false;
  bool dispatched = false;  // blocks allocated and the workers told
  size_t p = 0, d = 0;      // indices of instances_ (DP ranks of instances)
  std::vector<uint64_t> p_blocks, d_blocks;
  std::set<size_t> p_left, d_left;  // ranks that have not ended the request
  std::set<size_t> computed;        // prefill ranks past their last layer
  int64_t computed_ns = 0;          // the last of them
  int64_t d_end_ns = 0;             // the decode side's end, the last rank's
  bool d_told = false;              // read mode: the decode side was sent the read
  std::string params;
  std::chrono::steady_clock::time_point deadline;
  bool aborted = false;  // the router gave up on it (stuck)
  bool failed = false;
  std::string why;
  uint64_t bad_bytes = 0;
};

// The worker a fault run kills (SIZE_MAX: none alive). Prefill: one still computing a request
// if there is one (that request then cannot be done: the fault path runs), else one with
// requests in flight. Decode: one with a request whose prefill is still running (its producer
// is then writing to, or about to write to, a dead peer), else one whose KV is on its way.
inline size_t ChooseVictim(const std::vector<RequestState>& requests,
                           const std::vector<WorkerState>& workers, bool prefill) {
  for (const RequestState& r : requests) {
    if (!r.running) continue;
    if (prefill) {
      for (size_t w : r.p_left)
        if (!r.computed.count(w)) return w;
    } else if (!r.d_left.empty() && !r.p_left.empty()) {
      return *r.d_left.begin();
    }
  }
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
    const std::set<size_t>& left = prefill ? it->p_left : it->d_left;
    if (it->running && !left.empty()) return *left.begin();
  }
  for (size_t w = 0; w < workers.size(); ++w)
    if (workers[w].cfg.prefill == prefill && workers[w].alive) return w;
  return SIZE_MAX;
}

}  // namespace ferry::tools::pd
