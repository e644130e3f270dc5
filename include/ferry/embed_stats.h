// The embedding-offload service's counters and per-step phase timings (ServerStats), as
// Server::stats() returns them (ferry/embed_server.h) and the protocol's StatsRequest carries
// them, and QueryStats, which asks a running `ferry embed-serve` for them over its socket.
//
// A bucket holds the layer steps whose token count n has the same TokenBucket(n) (the largest
// power of two <= n; 0 for n = 0). Per bucket and phase the service keeps the count and sum of
// all samples and the last kStatSamples samples, of which a snapshot reports the median. Per
// bucket it also counts the layer steps each path (CPU gather, UVA kernel) ran.
//
// Thread safety: the types are plain values; the functions may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::embed::service {

// The phases of one layer step, in the order they happen; each is a duration in ns.
enum class Phase : uint8_t {
  kQueue = 0,  // request received -> the group's thread started the step (first layer only)
  kInputs,     // inputs copied out of shared memory and validated (first layer only)
  kReleased,   // every rank's previous output of the layer released (flags read back as reset)
  kDrain,      // the previous layer's copies finished reading the staging (with the layers
               // overlapped: the layer two back retired, its staging free)
  kGather,     // CPU path: ids and rows gathered; UVA: inputs uploaded and the kernel enqueued
  kCopyTail,   // gather returned -> the last copy issued
  kFinish,     // last copy issued -> every rank's DONE write enqueued (or set, host memory)
  kDone,       // DONE enqueued -> the DONE writes completed on the streams (CUDA; 0 in host)
  kLayer,      // the layer step: released wait done -> DONE completed (what the policy compares)
  kStep,       // request received -> this layer's DONE completed
  // With the layers overlapped (the copy-pump path), kFinish ends when the pump set DONE, and
  // kDone, kLayer and kStep end when the layer was retired: after the next layer's gather for
  // all but a step's last layer, so for those they are upper bounds; the policy is given
  // released wait done -> DONE enqueued for them.
  kCount,
};
inline constexpr size_t kPhaseCount = static_cast<size_t>(Phase::kCount);
std::string_view PhaseName(Phase p);

// Which implementation ran a layer step.
enum class StepPath : uint8_t { kCpu = 0, kUva = 1 };

inline constexpr size_t kStatSamples = 256;    // per bucket and phase, for the medians
inline constexpr size_t kMaxStatBuckets = 32;  // buckets a snapshot (and the protocol) holds

// The largest power of two <= tokens (0 for 0).
uint64_t TokenBucket(uint64_t tokens);

// Upper bounds of the phase histograms' buckets, in ns: 1-2.5-5 steps from 1 us to 10 s (the
// engine's latency buckets), so that dashboards can aggregate across services and restarts.
inline constexpr std::array<uint64_t, 22> kPhaseBoundsNs = {
    1'000,         2'500,         5'000,         10'000,        25'000,        50'000,
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,     5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000,   500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};

struct PhaseSummary {
  uint64_t count = 0;
  uint64_t sum_ns = 0;
  uint64_t median_ns = 0;  // of the last kStatSamples samples
  // histogram[i]: samples in (kPhaseBoundsNs[i-1], kPhaseBoundsNs[i]]; the last, above every
  // bound. Server::stats() fills it; the protocol's Stats (QueryStats) does not carry it.
  std::array<uint64_t, kPhaseBoundsNs.size() + 1> histogram{};
};

struct BucketStats {
  uint64_t bucket = 0;  // TokenBucket of the layer steps' token count
  uint64_t cpu_steps = 0;
  uint64_t uva_steps = 0;
  uint64_t copies = 0;  // copy calls issued to the ranks' outputs, all layer steps together
  std::array<PhaseSummary, kPhaseCount> phases{};
};

struct ServerStats {
  uint64_t registrations = 0;  // accepted so far
  uint64_t live_clients = 0;
  uint64_t steps_ok = 0;
  uint64_t steps_failed = 0;
  std::vector<BucketStats> buckets;  // ascending by bucket, at most kMaxStatBuckets
};

// A markdown table of the buckets: steps per path, then each phase's median (and mean) in
// microseconds. For `ferry embed-serve` and `ferry bench-embed`.
std::string FormatStats(const ServerStats& s);

// The Prometheus text exposition (version 0.0.4) of `s`: counters ferry_embed_registrations_total,
// ferry_embed_steps_total{result}, ferry_embed_layer_steps_total{bucket,path},
// ferry_embed_copies_total{bucket}, the gauge ferry_embed_live_clients and the histogram
// ferry_embed_phase_seconds{bucket,phase} (kPhaseBoundsNs). `service` labels every sample
// (service="<name>"); empty leaves it out.
std::string RenderPrometheus(const ServerStats& s, std::string_view service = {});

// The longest timeout QueryStats takes.
inline constexpr std::chrono::seconds kMaxQueryTimeout{24 * 3600};

// Asks the service listening at `socket_path` for its stats, on a connection of its own that
// registers nothing; reset: the service clears its phase timings after answering. Waits at
// most `timeout` in all (a service that is starting is retried until then).
// kInvalidArgument for a timeout outside (0, kMaxQueryTimeout] or a malformed answer;
// kUnavailable when no service answers; kDeadlineExceeded past the timeout;
// kResourceExhausted when the service serves as many connections as it may.
Result<ServerStats> QueryStats(const std::string& socket_path, bool reset,
                               std::chrono::nanoseconds timeout);

}  // namespace ferry::embed::service
