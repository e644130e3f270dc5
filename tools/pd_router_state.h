// What `ferry pd`'s router knows of its workers, instances and requests (pd_router.cc).
//
// Thread safety: plain values, owned by the router's one thread.
#pragma once

#include <chrono>
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

struct InstanceState {
  bool prefill = true;
  std::string name;
  uint32_t block_tokens = 16;
  std::vector<size_t> workers;
  BlockAllocator blocks{0};
  bool broken = false;  // a worker died: no new requests, its blocks are not counted
};

struct RequestState {
  uint64_t n = 0;
  std::string id;
  uint64_t tokens = 0;
  bool running = false;
  bool dispatched = false;  // blocks allocated and the workers told
  size_t p = 0, d = 0;
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

}  // namespace ferry::tools::pd
