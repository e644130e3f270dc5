// StepPolicy: which path runs a layer step, the CPU gather (rows gathered into pinned staging
// by the service's threads and copied to the GPU) or the UVA kernel (the GPU computes the ids
// and reads the rows from the pinned table itself), chosen per token-count bucket
// (TokenBucket) so that no step runs slower than the better of the two. The modes (UvaMode)
// and options (StepPolicyOptions) are public, in ferry/embed_server.h, which says how each
// mode chooses. Times are reported by the caller (Report) after the step, as the layer step's
// time (Phase::kLayer).
//
// Thread safety: none; one StepPolicy per data-parallel group, used by its thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>

#include "ferry/embed_server.h"
#include "ferry/embed_stats.h"

namespace ferry::embed::service {

class StepPolicy {
 public:
  // Values outside the limits (kMaxPolicyCount) are clamped to them (ValidateStepPolicyOptions
  // refuses them).
  explicit StepPolicy(const StepPolicyOptions& options);
  // The path for a layer step of `tokens` tokens; uva_possible: the step could run UVA.
  StepPath Choose(uint64_t tokens, bool uva_possible);
  // The measured time of a layer step that ran `path` (ignored unless kAuto).
  void Report(uint64_t tokens, StepPath path, uint64_t ns);
  // The median of the path's recent times in the bucket of `tokens`, or 0 without samples.
  uint64_t MedianNs(uint64_t tokens, StepPath path) const;
  const StepPolicyOptions& options() const { return options_; }

 private:
  struct Bucket {
    std::deque<uint64_t> times[2];  // by StepPath, the last `window`
    uint64_t samples[2] = {0, 0};   // all reported, by StepPath
    uint64_t choices = 0;           // made after the probes
  };
  static uint64_t Median(const std::deque<uint64_t>& d);
  StepPolicyOptions options_;
  std::map<uint64_t, Bucket> buckets_;
};

}  // namespace ferry::embed::service
