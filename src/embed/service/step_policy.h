// StepPolicy: which path runs a layer step, the CPU gather (rows gathered into pinned staging
// by the service's threads and copied to the GPU) or the UVA kernel (the GPU computes the ids
// and reads the rows from the pinned table itself), chosen per token-count bucket
// (TokenBucket) so that no step runs slower than the better of the two.
//
// kOff: always the CPU path. kAlways: UVA whenever the step can run it. kAuto: for each bucket,
// the first `probes` layer steps of each path are probes (alternating, the path with fewer
// samples first, CPU on ties); then the path with the lower median of its last `window`
// measured times runs, and every `reprobe_every`-th choice in a bucket runs the other path
// once, so a change in either path's cost (another table size, a busier machine) is seen.
// A step that cannot run UVA (host outputs, an unpinned table) runs the CPU path and does not
// count towards the choice. Times are reported by the caller (Report) after the step, as the
// layer step's time (Phase::kLayer).
//
// Thread safety: none; one StepPolicy per data-parallel group, used by its thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>

#include "embed/service/step_stats.h"
#include "ferry/status.h"

namespace ferry::embed::service {

enum class UvaMode : uint8_t { kOff = 0, kAlways = 1, kAuto = 2 };
// "off", "always", "auto"; kInvalidArgument otherwise.
Result<UvaMode> ParseUvaMode(std::string_view s);
std::string_view UvaModeName(UvaMode m);

struct StepPolicyOptions {
  UvaMode mode = UvaMode::kAuto;
  int probes = 3;          // measured steps of each path per bucket before choosing; >= 1
  int window = 8;          // recent times per path and bucket the median is taken of; >= 1
  int reprobe_every = 64;  // every n-th choice runs the other path once; 0: never
};

inline constexpr int kMaxPolicyCount = 1 << 20;

// kInvalidArgument, naming the option, for probes or window outside [1, kMaxPolicyCount] or
// reprobe_every outside [0, kMaxPolicyCount].
Status ValidateStepPolicyOptions(const StepPolicyOptions& options);

class StepPolicy {
 public:
  // Values outside the limits above are clamped to them (ValidateStepPolicyOptions refuses them).
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
