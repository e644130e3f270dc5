#include "engine/metrics.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace ferry {
namespace internal {

void Histogram::Observe(int64_t ns) {
  if (ns < 0) ns = 0;
  const auto it = std::lower_bound(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end(), ns);
  buckets_[static_cast<size_t>(it - kLatencyBoundsNs.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot h;
  for (int64_t b : kLatencyBoundsNs) h.bounds_seconds.push_back(static_cast<double>(b) * 1e-9);
  for (const auto& b : buckets_) {
    h.counts.push_back(b.load(std::memory_order_relaxed));
    h.count += h.counts.back();
  }
  h.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return h;
}

void Series::Record(const Status& status, uint64_t ok_bytes, int64_t latency_ns) {
  const size_t code = std::min<size_t>(static_cast<size_t>(status.code()), kCodes - 1);
  results[code].fetch_add(1, std::memory_order_relaxed);
  if (status.ok()) bytes.fetch_add(ok_bytes, std::memory_order_relaxed);
  latency.Observe(latency_ns);
}

Series* Metrics::SeriesFor(std::string_view kind, std::string_view transport, std::string_view peer) {
  MutexLock lock(&mu_);
  auto key = std::make_tuple(std::string(kind), std::string(transport), std::string(peer));
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  Series& s = series_.emplace_back();
  s.kind = kind;
  s.transport = transport;
  s.peer = peer;
  index_.emplace(std::move(key), &s);
  return &s;
}

void Metrics::Track(const std::shared_ptr<TransferState>& state, Series* series, uint64_t ops) {
  series->ops.fetch_add(ops, std::memory_order_relaxed);
  // The observer runs while the state is alive (at its end, or in its destructor), exactly
  // once, so it owns the node; Metrics is held so that a transfer may outlive its engine.
  Live* live = new Live{shared_from_this(), state.get(), series, Clock::now()};
  {
    Shard& shard = ShardOf(live->state);
    MutexLock lock(&shard.mu);
    live->next = shard.head;
    if (shard.head) shard.head->prev = live;
    shard.head = live;
    ++shard.count;
  }
  state->OnFinish([live](const Status& s) { Finished(live, s); });
}

void Metrics::Finished(Live* live, const Status& status) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - live->posted).count();
  {
    Shard& shard = live->owner->ShardOf(live->state);
    MutexLock lock(&shard.mu);
    if (live->prev) live->prev->next = live->next;
    else shard.head = live->next;
    if (live->next) live->next->prev = live->prev;
    --shard.count;
  }
  live->series->Record(status, live->state->bytes(), ns);
  delete live;
}

std::vector<SeriesSnapshot> Metrics::SnapshotSeries() const {
  MutexLock lock(&mu_);
  std::vector<SeriesSnapshot> out;
  for (const Series& s : series_) {
    SeriesSnapshot snap;
    snap.kind = s.kind;
    snap.transport = s.transport;
    snap.peer = s.peer;
    for (size_t c = 0; c < Series::kCodes; ++c) {
      const uint64_t n = s.results[c].load(std::memory_order_relaxed);
      if (n) snap.results[std::string(CodeName(static_cast<Code>(c)))] = n;
    }
    snap.bytes = s.bytes.load(std::memory_order_relaxed);
    snap.ops = s.ops.load(std::memory_order_relaxed);
    snap.latency = s.latency.Snapshot();
    out.push_back(std::move(snap));
  }
  return out;
}

uint64_t Metrics::in_flight() const {
  uint64_t n = 0;
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    n += shard.count;
  }
  return n;
}

std::vector<InFlightTransfer> Metrics::InFlight() const {
  std::vector<InFlightTransfer> out;
  const Clock::time_point now = Clock::now();
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    for (const Live* live = shard.head; live; live = live->next) {
      const TransferState* state = live->state;
      InFlightTransfer t;
      t.id = state->id();
      t.peer = live->series->peer;
      t.path = state->path();
      t.bytes = state->bytes();
      t.age = now - live->posted;
      const Clock::time_point at = state->deadline().at();
      t.deadline_in = at == Clock::time_point::max() ? Duration::max() : at - now;
      out.push_back(std::move(t));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.age > b.age; });
  return out;
}

}  // namespace internal

std::string_view FailureCause(Code code) {
  switch (code) {
    case Code::kOk: return "";
    case Code::kUnavailable: return "peer_dead";
    case Code::kDeadlineExceeded: return "deadline";
    case Code::kResourceExhausted:
    case Code::kInvalidArgument:
    case Code::kFailedPrecondition:
    case Code::kPermissionDenied: return "rejected";
    case Code::kOutOfRange: return "out_of_range";
    case Code::kAborted:
    case Code::kCancelled: return "aborted";
    default: return "other";
  }
}

namespace {

// A label value with \, " and newline escaped (the exposition format's rule).
std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

std::string RenderPrometheus(const MetricsSnapshot& m) {
  const std::string engine = "engine=\"" + Escape(m.engine) + "\"";
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto labels = [&](const SeriesSnapshot& s) {
    return engine + ",transport=\"" + Escape(s.transport) + "\",peer=\"" + Escape(s.peer) + "\"";
  };
  for (const char* kind : {"transfer", "notification"}) {
    const std::string base = std::string("ferry_") + kind + "s";
    head((base + "_total").c_str(), "counter", "finished, by transport, peer and result (status code)");
    for (const auto& s : m.series)
      if (s.kind == kind)
        for (const auto& [result, n] : s.results)
          out += base + "_total{" + labels(s) + ",result=\"" + result + "\"} " + std::to_string(n) + "\n";
    if (std::string_view(kind) == "transfer") {
      head("ferry_transfer_bytes_total", "counter", "bytes of the transfers that finished OK");
      for (const auto& s : m.series)
        if (s.kind == kind) out += "ferry_transfer_bytes_total{" + labels(s) + "} " + std::to_string(s.bytes) + "\n";
      head("ferry_transfer_ops_total", "counter", "ops posted (after merging adjacent ones)");
      for (const auto& s : m.series)
        if (s.kind == kind) out += "ferry_transfer_ops_total{" + labels(s) + "} " + std::to_string(s.ops) + "\n";
    }
    const std::string hist = std::string("ferry_") + kind + "_seconds";
    head(hist.c_str(), "histogram", "latency, post to completion");
    for (const auto& s : m.series) {
      if (s.kind != kind) continue;
      uint64_t cum = 0;
      for (size_t i = 0; i < s.latency.counts.size(); ++i) {
        cum += s.latency.counts[i];
        const std::string le = i < s.latency.bounds_seconds.size() ? Num(s.latency.bounds_seconds[i]) : "+Inf";
        out += hist + "_bucket{" + labels(s) + ",le=\"" + le + "\"} " + std::to_string(cum) + "\n";
      }
      out += hist + "_sum{" + labels(s) + "} " + Num(s.latency.sum_seconds) + "\n";
      out += hist + "_count{" + labels(s) + "} " + std::to_string(s.latency.count) + "\n";
    }
  }
  head("ferry_failures_total", "counter", "failed transfers and notifications by cause");
  for (const auto& [cause, n] : m.failures)
    out += "ferry_failures_total{" + engine + ",cause=\"" + cause + "\"} " + std::to_string(n) + "\n";
  auto gauge = [&](const char* name, const char* type, const char* help, uint64_t v) {
    head(name, type, help);
    out += std::string(name) + "{" + engine + "} " + std::to_string(v) + "\n";
  };
  gauge("ferry_transfers_in_flight", "gauge", "transfers posted and not finished", m.transfers_in_flight);
  gauge("ferry_peers", "gauge", "peers added", m.peers);
  gauge("ferry_registered_regions", "gauge", "memory regions registered", m.registered_regions);
  gauge("ferry_registered_bytes", "gauge", "bytes of memory registered", m.registered_bytes);
  gauge("ferry_dropped_notifications_total", "counter", "notifications dropped at this receiver (backlog full)",
        m.dropped_notifications);
  gauge("ferry_rejected_messages_total", "counter", "messages from peers that did not decode",
        m.rejected_messages);
  gauge("ferry_auth_failures_total", "counter", "connections refused: the peer did not prove the deployment's secret",
        m.auth_failures);
  gauge("ferry_connections_refused_total", "counter",
        "connections refused at accept: the transport held its limit of connections", m.connections_refused);
  gauge("ferry_access_denied_total", "counter", "requests refused: the peer is not on the region's access list",
        m.access_denied);
  return out;
}

std::string RenderInFlight(const std::vector<InFlightTransfer>& transfers) {
  std::string out = "ferry: " + std::to_string(transfers.size()) + " transfer(s) in flight\n";
  auto ms = [](Duration d) { return Num(std::chrono::duration<double, std::milli>(d).count()); };
  for (const InFlightTransfer& t : transfers) {
    out += "  id " + std::to_string(static_cast<uint64_t>(t.id)) + " peer " + (t.peer.empty() ? "-" : t.peer) +
           " path " + (t.path.transport.empty() ? "-" : t.path.ToString()) + " bytes " + std::to_string(t.bytes) +
           " age " + ms(t.age) + " ms deadline " +
           (t.deadline_in == Duration::max() ? std::string("none") : "in " + ms(t.deadline_in) + " ms") + "\n";
  }
  return out;
}

}  // namespace ferry
