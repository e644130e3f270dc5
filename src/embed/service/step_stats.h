// The service side of the embedding-offload service's phase timings (the public types are in
// ferry/embed_stats.h): one layer step's measured phases (LayerTiming) and the recorder that
// aggregates them by token-count bucket (StepStatsRecorder), of which Server::stats() reports
// snapshots.
//
// Thread safety: StepStatsRecorder may be used from any thread (one mutex, taken once per
// layer step by Commit and once per Snapshot); LayerTiming is a plain value.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "base/mutex.h"
#include "ferry/embed_stats.h"

namespace ferry::embed::service {

// One layer step's phase durations; phases not measured stay unset.
struct LayerTiming {
  uint64_t tokens = 0;
  StepPath path = StepPath::kCpu;
  uint64_t copies = 0;
  std::array<int64_t, kPhaseCount> ns;  // -1: not measured
  LayerTiming() { ns.fill(-1); }
  void Set(Phase p, int64_t value) { ns[static_cast<size_t>(p)] = value < 0 ? 0 : value; }
};

class StepStatsRecorder {
 public:
  void Commit(const LayerTiming& t) EXCLUDES(mu_);
  // The buckets so far; with reset, clears them afterwards.
  std::vector<BucketStats> Snapshot(bool reset) EXCLUDES(mu_);

 private:
  struct Series {
    uint64_t count = 0, sum = 0;
    std::vector<uint64_t> last;  // ring of kStatSamples
    std::array<uint64_t, kPhaseBoundsNs.size() + 1> histogram{};  // PhaseSummary::histogram
  };
  struct Bucket {
    uint64_t cpu = 0, uva = 0, copies = 0;
    std::array<Series, kPhaseCount> phases;
  };
  Mutex mu_;
  std::map<uint64_t, Bucket> buckets_ GUARDED_BY(mu_);
};

}  // namespace ferry::embed::service
