// The embedding-offload service's counters and phase timings (ferry/embed_stats.h) as JSON,
// for `ferry embed-serve --json` and `ferry bench-embed --json`.
//
// Thread safety: free functions.
#pragma once

#include <nlohmann/json.hpp>

#include "ferry/embed_stats.h"

namespace ferry::tools {

// {"registrations", "live_clients", "steps_ok", "steps_failed", "buckets": [{"bucket",
// "cpu_steps", "uva_steps", "copies", "phases": {"<phase>": {"count", "median_us",
// "mean_us"}}}]}.
nlohmann::ordered_json EmbedStatsJson(const embed::service::ServerStats& stats);

}  // namespace ferry::tools
