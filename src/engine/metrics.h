// Metrics: an engine's counters, latency histograms and its registry of live transfers
// (ferry/metrics.h is the public snapshot).
//
// The hot path is posting and finishing a transfer: Track() at posting takes one shard's lock
// (of kShards, picked by the transfer's address) to enter the transfer in the live registry and
// adds an observer to it; at its end the observer takes the same shard's lock to remove it and
// adds to its series' atomic counters and histogram buckets (relaxed; no lock). A series (kind,
// transport, peer) is looked up once per session (SeriesFor) and lives as long as Metrics.
//
// Invariants:
//  - a transfer is in the registry from Track() until its observer ran (it finished, or was
//    destroyed unfinished); InFlight() reads a registered TransferState under the shard's lock,
//    which the observer needs before the state can go.
//  - series_ only grows; a Series* handed out stays valid while Metrics lives.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/metrics.h"
#include "transport/transfer_state.h"

namespace ferry::internal {

// Upper bounds of the latency buckets, in nanoseconds: 1-2.5-5 steps from 1 us to 10 s.
inline constexpr std::array<int64_t, 22> kLatencyBoundsNs = {
    1'000,         2'500,         5'000,         10'000,        25'000,        50'000,
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,     5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000,   500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};

class Histogram {
 public:
  void Observe(int64_t ns);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kLatencyBoundsNs.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

struct Series {
  static constexpr size_t kCodes = 17;  // Code::kOk .. Code::kInProgress
  std::string kind, transport, peer;
  std::array<std::atomic<uint64_t>, kCodes> results{};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> ops{0};
  Histogram latency;

  // Counts one finished piece of work.
  void Record(const Status& status, uint64_t ok_bytes, int64_t latency_ns);
};

class Metrics : public std::enable_shared_from_this<Metrics> {
 public:
  // The series of `kind` to `peer` over `transport`, made on first use.
  Series* SeriesFor(std::string_view kind, std::string_view transport, std::string_view peer) EXCLUDES(mu_);
  // Enters `state` in the live registry and counts it in `series` when it finishes.
  // REQUIRES: called once per state, from the thread that hands it out.
  void Track(const std::shared_ptr<TransferState>& state, Series* series, uint64_t ops);

  std::vector<SeriesSnapshot> SnapshotSeries() const EXCLUDES(mu_);
  uint64_t in_flight() const;
  std::vector<InFlightTransfer> InFlight() const;

 private:
  // One allocation a transfer: the node of its shard's list, which the observer's capture
  // points to (so the std::function needs no allocation of its own either).
  struct Live {
    std::shared_ptr<Metrics> owner;  // keeps Metrics alive while the transfer is
    const TransferState* state;
    Series* series;
    Clock::time_point posted;
    Live* prev = nullptr;
    Live* next = nullptr;
  };
  struct alignas(64) Shard {
    mutable Mutex mu;
    Live* head GUARDED_BY(mu) = nullptr;
    size_t count GUARDED_BY(mu) = 0;
  };
  static constexpr size_t kShards = 16;
  Shard& ShardOf(const TransferState* s) {
    return shards_[(reinterpret_cast<uintptr_t>(s) >> 6) % kShards];
  }
  static void Finished(Live* live, const Status& status);

  std::array<Shard, kShards> shards_;
  mutable Mutex mu_;
  std::map<std::tuple<std::string, std::string, std::string>, Series*, std::less<>> index_ GUARDED_BY(mu_);
  std::deque<Series> series_ GUARDED_BY(mu_);
};

}  // namespace ferry::internal
