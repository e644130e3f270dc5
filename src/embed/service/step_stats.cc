#include "embed/service/step_stats.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "embed/names.h"

namespace ferry::embed::service {

namespace {

constexpr NameTable<Phase, kPhaseCount> kPhaseNames = {{{Phase::kQueue, "queue"},
                                                        {Phase::kInputs, "inputs"},
                                                        {Phase::kReleased, "released"},
                                                        {Phase::kDrain, "drain"},
                                                        {Phase::kGather, "gather"},
                                                        {Phase::kCopyTail, "copy_tail"},
                                                        {Phase::kFinish, "finish"},
                                                        {Phase::kDone, "done"},
                                                        {Phase::kLayer, "layer"},
                                                        {Phase::kStep, "step"}}};
static_assert(std::ranges::all_of(kPhaseNames, [](const auto& e) { return !e.second.empty(); }),
              "a phase without a name");

}  // namespace

std::string_view PhaseName(Phase p) { return NameOf(kPhaseNames, p); }

uint64_t TokenBucket(uint64_t tokens) { return tokens == 0 ? 0 : std::bit_floor(tokens); }

std::string FormatStats(const ServerStats& s) {
  std::string out = "| bucket (tokens >=) | cpu steps | uva steps | copies per step |";
  std::string rule = "| --- | --- | --- | --- |";
  for (size_t i = 0; i < kPhaseCount; ++i) {
    out.append(" ");
    out.append(PhaseName(static_cast<Phase>(i)));
    out.append(" us |");
    rule.append(" --- |");
  }
  out.append("\n");
  out.append(rule);
  out.append("\n");
  char buf[64];
  for (const BucketStats& b : s.buckets) {
    const uint64_t n = b.cpu_steps + b.uva_steps;
    std::snprintf(buf, sizeof(buf), "| %llu | %llu | %llu | %.1f |", (unsigned long long)b.bucket,
                  (unsigned long long)b.cpu_steps, (unsigned long long)b.uva_steps,
                  n == 0 ? 0.0 : static_cast<double>(b.copies) / n);
    out += buf;
    for (const PhaseSummary& p : b.phases) {
      if (p.count == 0) {
        out += " - |";
        continue;
      }
      std::snprintf(buf, sizeof(buf), " %.1f (%.1f) |", p.median_ns / 1e3,
                    static_cast<double>(p.sum_ns) / p.count / 1e3);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

void StepStatsRecorder::Commit(const LayerTiming& t) {
  MutexLock lock(&mu_);
  const uint64_t key = TokenBucket(t.tokens);
  if (buckets_.size() >= kMaxStatBuckets && buckets_.find(key) == buckets_.end()) return;
  Bucket& b = buckets_[key];
  (t.path == StepPath::kUva ? b.uva : b.cpu)++;
  b.copies += t.copies;
  for (size_t i = 0; i < kPhaseCount; ++i) {
    if (t.ns[i] < 0) continue;
    Series& s = b.phases[i];
    const uint64_t v = static_cast<uint64_t>(t.ns[i]);
    if (s.last.size() < kStatSamples)
      s.last.push_back(v);
    else
      s.last[s.count % kStatSamples] = v;
    ++s.count;
    s.sum += v;
    ++s.histogram[std::lower_bound(kPhaseBoundsNs.begin(), kPhaseBoundsNs.end(), v) - kPhaseBoundsNs.begin()];
  }
}

std::vector<BucketStats> StepStatsRecorder::Snapshot(bool reset) {
  MutexLock lock(&mu_);
  std::vector<BucketStats> out;
  for (auto& [key, b] : buckets_) {
    BucketStats s;
    s.bucket = key;
    s.cpu_steps = b.cpu;
    s.uva_steps = b.uva;
    s.copies = b.copies;
    for (size_t i = 0; i < kPhaseCount; ++i) {
      const Series& x = b.phases[i];
      s.phases[i].count = x.count;
      s.phases[i].sum_ns = x.sum;
      s.phases[i].histogram = x.histogram;
      if (!x.last.empty()) {
        std::vector<uint64_t> v = x.last;
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        s.phases[i].median_ns = v[v.size() / 2];
      }
    }
    out.push_back(s);
  }
  if (reset) buckets_.clear();
  return out;
}

}  // namespace ferry::embed::service
