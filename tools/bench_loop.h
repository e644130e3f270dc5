// The measurement loop of `ferry bench`: posts one batch at a time on a Session and times each
// from post to completion. It knows nothing of how the session was obtained (see link.h).
//
// Thread safety: MeasurePoint may run on any thread; points run one after another.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/engine.h"
#include "report.h"

namespace ferry::tools {

struct PointSpec {
  Op op = Op::kWrite;
  uint64_t piece_bytes = 0;
  uint64_t batch = 1;                                  // pieces per batch
  uint64_t min_iters = 5;                              // batches timed at least ...
  Duration min_time = std::chrono::milliseconds(200);  // ... and for at least this long
  uint64_t max_iters = 1'000'000;
  uint64_t warmup_iters = 1;                     // untimed batches first
  Duration deadline = std::chrono::seconds(30);  // of each batch
};

struct PointResult {
  PointSpec spec;
  uint64_t iters = 0;
  uint64_t bytes = 0;      // moved while timed
  double seconds = 0;      // wall time of the timed batches
  double gbps = 0;         // bytes / seconds, in 10^9 bytes per second
  LatencySummary latency;  // per batch, post to completion
};

// The ops of one batch: piece i at local offset i * piece, and at a shuffled slot on the remote
// side (a fixed permutation from `seed`), so the remote pieces are scattered. With `run` > 1
// the slots move in runs of `run` adjacent ones (the last run may be shorter): KV blocks
// allocated in runs, which the engine merges (EngineOptions::merge_adjacent_ops).
std::vector<TransferOp> PlanScatteredOps(uint64_t piece_bytes, uint64_t batch, uint64_t run = 1,
                                         uint64_t seed = 1);

// Runs warm-up then timed batches of `ops`. REQUIRES: every op lies inside both regions.
// The first failed batch ends the point with its status.
Result<PointResult> MeasurePoint(const Session& session, const PointSpec& spec,
                                 std::span<const TransferOp> ops);

// The baseline of the same run for a host-memory point: one thread's memcpy of the same pieces
// (same sizes, same scattered offsets) between two plain host buffers, timed for at least
// `min_time` and `min_iters` batches; GB/s as MeasurePoint counts it.
double MemcpyBaselineGbps(std::span<const TransferOp> ops, Duration min_time, uint64_t min_iters = 5);

}  // namespace ferry::tools
