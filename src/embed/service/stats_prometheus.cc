// RenderPrometheus (ferry/embed_stats.h): the service's counters and phase histograms as
// Prometheus text, in the shape the engine's /metrics has (names start with ferry_, histograms
// cumulative with le="+Inf" last, durations in seconds).
#include <cstdio>
#include <string>

#include "ferry/embed_stats.h"

namespace ferry::embed::service {
namespace {

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

std::string Seconds(double ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", ns / 1e9);
  return buf;
}

}  // namespace

std::string RenderPrometheus(const ServerStats& s, std::string_view service) {
  // Every sample's labels begin with the service's, when named.
  const std::string base = service.empty() ? std::string() : "service=\"" + Escape(service) + "\"";
  auto labels = [&](const std::string& more) {
    if (base.empty()) return more.empty() ? std::string() : "{" + more + "}";
    return "{" + base + (more.empty() ? "" : "," + more) + "}";
  };
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  head("ferry_embed_registrations_total", "counter", "client registrations accepted");
  out += "ferry_embed_registrations_total" + labels("") + " " + std::to_string(s.registrations) + "\n";
  head("ferry_embed_live_clients", "gauge", "clients registered now");
  out += "ferry_embed_live_clients" + labels("") + " " + std::to_string(s.live_clients) + "\n";
  head("ferry_embed_steps_total", "counter", "steps served, by result");
  out += "ferry_embed_steps_total" + labels("result=\"ok\"") + " " + std::to_string(s.steps_ok) + "\n";
  out += "ferry_embed_steps_total" + labels("result=\"failed\"") + " " + std::to_string(s.steps_failed) + "\n";
  head("ferry_embed_layer_steps_total", "counter", "layer steps, by token bucket and path (cpu gather, uva kernel)");
  for (const BucketStats& b : s.buckets) {
    const std::string bucket = "bucket=\"" + std::to_string(b.bucket) + "\"";
    out += "ferry_embed_layer_steps_total" + labels(bucket + ",path=\"cpu\"") + " " + std::to_string(b.cpu_steps) + "\n";
    out += "ferry_embed_layer_steps_total" + labels(bucket + ",path=\"uva\"") + " " + std::to_string(b.uva_steps) + "\n";
  }
  head("ferry_embed_copies_total", "counter", "copies issued to the ranks' outputs, by token bucket");
  for (const BucketStats& b : s.buckets)
    out += "ferry_embed_copies_total" + labels("bucket=\"" + std::to_string(b.bucket) + "\"") + " " +
           std::to_string(b.copies) + "\n";
  head("ferry_embed_phase_seconds", "histogram", "duration of each phase of a layer step, by token bucket");
  for (const BucketStats& b : s.buckets) {
    for (size_t p = 0; p < kPhaseCount; ++p) {
      const PhaseSummary& ph = b.phases[p];
      if (ph.count == 0) continue;  // a phase this bucket never measured (e.g. done in host mode)
      const std::string l = "bucket=\"" + std::to_string(b.bucket) + "\",phase=\"" +
                            std::string(PhaseName(static_cast<Phase>(p))) + "\"";
      uint64_t cumulative = 0;
      for (size_t i = 0; i < ph.histogram.size(); ++i) {
        cumulative += ph.histogram[i];
        const std::string le = i < kPhaseBoundsNs.size() ? Seconds(static_cast<double>(kPhaseBoundsNs[i])) : "+Inf";
        out += "ferry_embed_phase_seconds_bucket" + labels(l + ",le=\"" + le + "\"") + " " +
               std::to_string(cumulative) + "\n";
      }
      out += "ferry_embed_phase_seconds_sum" + labels(l) + " " + Seconds(static_cast<double>(ph.sum_ns)) + "\n";
      out += "ferry_embed_phase_seconds_count" + labels(l) + " " + std::to_string(ph.count) + "\n";
    }
  }
  return out;
}

}  // namespace ferry::embed::service
