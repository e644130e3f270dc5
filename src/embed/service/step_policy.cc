#include "embed/service/step_policy.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "embed/checks.h"
#include "embed/names.h"

namespace ferry::embed::service {

namespace {

constexpr NameTable<UvaMode, 3> kUvaModeNames = {
    {{UvaMode::kOff, "off"}, {UvaMode::kAlways, "always"}, {UvaMode::kAuto, "auto"}}};

}  // namespace

Result<UvaMode> ParseUvaMode(std::string_view s) {
  if (std::optional<UvaMode> m = ValueNamed(kUvaModeNames, s)) return *m;
  return Status(Code::kInvalidArgument, "UVA mode must be " + NameList(kUvaModeNames) +
                                            ", not '" + std::string(s) + "'");
}

std::string_view UvaModeName(UvaMode m) { return NameOf(kUvaModeNames, m); }

Status ValidateStepPolicyOptions(const StepPolicyOptions& options) {
  FERRY_RETURN_IF_ERROR(CheckInRange("UVA probes", options.probes, 1, kMaxPolicyCount));
  FERRY_RETURN_IF_ERROR(CheckInRange("UVA window", options.window, 1, kMaxPolicyCount));
  return CheckInRange("UVA reprobe_every", options.reprobe_every, 0, kMaxPolicyCount);
}

StepPolicy::StepPolicy(const StepPolicyOptions& options) : options_(options) {
  options_.probes = std::clamp(options_.probes, 1, kMaxPolicyCount);
  options_.window = std::clamp(options_.window, 1, kMaxPolicyCount);
  options_.reprobe_every = std::clamp(options_.reprobe_every, 0, kMaxPolicyCount);
}

uint64_t StepPolicy::Median(const std::deque<uint64_t>& d) {
  if (d.empty()) return 0;
  std::vector<uint64_t> v(d.begin(), d.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

StepPath StepPolicy::Choose(uint64_t tokens, bool uva_possible) {
  if (!uva_possible || options_.mode == UvaMode::kOff) return StepPath::kCpu;
  if (options_.mode == UvaMode::kAlways) return StepPath::kUva;
  Bucket& b = buckets_[TokenBucket(tokens)];
  const uint64_t probes = static_cast<uint64_t>(options_.probes);
  const uint64_t cpu = b.samples[0], uva = b.samples[1];
  if (cpu < probes || uva < probes) return uva < cpu ? StepPath::kUva : StepPath::kCpu;
  const StepPath best = Median(b.times[1]) < Median(b.times[0]) ? StepPath::kUva : StepPath::kCpu;
  ++b.choices;
  if (options_.reprobe_every > 0 && b.choices % options_.reprobe_every == 0)
    return best == StepPath::kUva ? StepPath::kCpu : StepPath::kUva;
  return best;
}

void StepPolicy::Report(uint64_t tokens, StepPath path, uint64_t ns) {
  if (options_.mode != UvaMode::kAuto) return;
  Bucket& b = buckets_[TokenBucket(tokens)];
  const size_t i = static_cast<size_t>(path);
  b.times[i].push_back(ns);
  while (b.times[i].size() > static_cast<size_t>(options_.window)) b.times[i].pop_front();
  ++b.samples[i];
}

uint64_t StepPolicy::MedianNs(uint64_t tokens, StepPath path) const {
  auto it = buckets_.find(TokenBucket(tokens));
  if (it == buckets_.end()) return 0;
  return Median(it->second.times[static_cast<size_t>(path)]);
}

}  // namespace ferry::embed::service
