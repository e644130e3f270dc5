// Metrics of an engine (Engine::Metrics) and the transfers it has in flight (Engine::InFlight):
// a snapshot of counters, fixed-bucket latency histograms and gauges, and its rendering as
// Prometheus text (version 0.0.4), so that a deployment can be watched, and a stuck one read,
// without a debugger.
//
// Counters are per series: one kind of work ("transfer" or "notification") to one peer over
// one transport, split by result (the final status code: "OK", "OUT_OF_RANGE", ...). Failures
// are also summed by cause, so that a lease or deadline expiry is never mistaken for a
// transport fault:
//   peer_dead     kUnavailable (the peer or its connection went away)
//   deadline      kDeadlineExceeded
//   rejected      kResourceExhausted, kInvalidArgument, kFailedPrecondition, kPermissionDenied
//   out_of_range  kOutOfRange
//   aborted       kAborted, kCancelled (the engine shut down, a transfer dropped unfinished)
//   other         any other code
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/descriptors.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

// A histogram with fixed upper bounds (seconds, ascending); counts[i] is the number of
// observations in (bounds[i-1], bounds[i]], and counts.back() those above the last bound.
struct HistogramSnapshot {
  std::vector<double> bounds_seconds;
  std::vector<uint64_t> counts;  // bounds_seconds.size() + 1 entries
  uint64_t count = 0;
  double sum_seconds = 0;
};

struct SeriesSnapshot {
  std::string kind;       // "transfer" or "notification"
  std::string transport;  // "" for notifications and for transfers refused before a route
  std::string peer;       // the peer engine's key
  std::map<std::string, uint64_t> results;  // status code name -> finished count
  uint64_t bytes = 0;  // bytes of the transfers that finished OK
  uint64_t ops = 0;    // ops posted (after merging adjacent ones)
  HistogramSnapshot latency;  // post to completion, every result
};

struct MetricsSnapshot {
  std::string engine;  // this engine's key
  std::vector<SeriesSnapshot> series;
  // Failed transfers and notifications by cause (see above); every cause is present.
  std::map<std::string, uint64_t> failures;
  uint64_t transfers_in_flight = 0;
  uint64_t peers = 0;
  uint64_t registered_regions = 0;
  uint64_t registered_bytes = 0;
  uint64_t dropped_notifications = 0;  // EngineStats::dropped_notifications
  uint64_t rejected_messages = 0;      // EngineStats::rejected_messages
  uint64_t auth_failures = 0;          // EngineStats::auth_failures
  uint64_t connections_refused = 0;    // EngineStats::connections_refused
  uint64_t access_denied = 0;          // EngineStats::access_denied
};

// The Prometheus text exposition of `m` (metric names start with "ferry_"; every sample has
// an engine="<key>" label).
std::string RenderPrometheus(const MetricsSnapshot& m);

// The cause (see above) under which a failure with `code` is counted; "" for kOk.
std::string_view FailureCause(Code code);

// One transfer still running.
struct InFlightTransfer {
  TransferId id{};
  std::string peer;     // "" when not known (e.g. a NotifyAfter's own transfer names it)
  TransferPath path;
  uint64_t bytes = 0;
  Duration age{};        // since it was posted
  Duration deadline_in{};  // until its deadline; negative once past
};

// One line a transfer, oldest first, with a header line; for logs and `ferry` servers.
std::string RenderInFlight(const std::vector<InFlightTransfer>& transfers);

}  // namespace ferry
