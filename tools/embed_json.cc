#include "embed_json.h"

#include <string>

namespace ferry::tools {

nlohmann::ordered_json EmbedStatsJson(const embed::service::ServerStats& stats) {
  namespace svc = embed::service;
  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  for (const svc::BucketStats& b : stats.buckets) {
    nlohmann::ordered_json phases = nlohmann::ordered_json::object();
    for (size_t p = 0; p < svc::kPhaseCount; ++p) {
      const svc::PhaseSummary& s = b.phases[p];
      if (s.count == 0) continue;
      phases[std::string(svc::PhaseName(static_cast<svc::Phase>(p)))] = {
          {"count", s.count},
          {"median_us", static_cast<double>(s.median_ns) / 1e3},
          {"mean_us", static_cast<double>(s.sum_ns) / static_cast<double>(s.count) / 1e3}};
    }
    buckets.push_back({{"bucket", b.bucket},
                       {"cpu_steps", b.cpu_steps},
                       {"uva_steps", b.uva_steps},
                       {"copies", b.copies},
                       {"phases", std::move(phases)}});
  }
  return {{"registrations", stats.registrations},
          {"live_clients", stats.live_clients},
          {"steps_ok", stats.steps_ok},
          {"steps_failed", stats.steps_failed},
          {"buckets", std::move(buckets)}};
}

}  // namespace ferry::tools
