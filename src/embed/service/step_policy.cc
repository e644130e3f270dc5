#include "embed/service/step_policy.h"

#include <algorithm>
#include <vector>

namespace ferry::embed::service {

Result<UvaMode> ParseUvaMode(std::string_view s) {
  if (s == "off") return UvaMode::kOff;
  if (s == "always") return UvaMode::kAlways;
  if (s == "auto") return UvaMode::kAuto;
  return Status(Code::kInvalidArgument,
                "UVA mode must be off, always or auto, not '" + std::string(s) + "'");
}

std::string_view UvaModeName(UvaMode m) {
  switch (m) {
    case UvaMode::kOff:
      return "off";
    case UvaMode::kAlways:
      return "always";
    case UvaMode::kAuto:
      return "auto";
  }
  return "?";
}

Status ValidateStepPolicyOptions(const StepPolicyOptions& options) {
  auto check = [](const char* what, int v, int lo) {
    if (v >= lo && v <= kMaxPolicyCount) return Status::Ok();
    return Status(Code::kInvalidArgument, std::string(what) + " must be in [" +
                                              std::to_string(lo) + ", " +
                                              std::to_string(kMaxPolicyCount) + "], not " +
                                              std::to_string(v));
  };
  FERRY_RETURN_IF_ERROR(check("UVA probes", options.probes, 1));
  FERRY_RETURN_IF_ERROR(check("UVA window", options.window, 1));
  return check("UVA reprobe_every", options.reprobe_every, 0);
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
