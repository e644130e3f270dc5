#include "pd_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report.h"
#include "units.h"

namespace ferry::tools::pd {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

Summary Summarize(const std::vector<RequestRecord>& requests,
                  const std::vector<WorkerRecord>& workers, const RunFacts& facts) {
  Summary s;
  s.requests = requests.size();
  std::vector<double> exposed, layer_bytes;
  for (const RequestRecord& r : requests) {
    switch (r.end) {
      case RequestEnd::kDone:
        ++s.done;
        s.bytes += r.bytes;
        if (r.exposed_us >= 0) exposed.push_back(r.exposed_us);
        if (facts.layers != 0) layer_bytes.push_back(static_cast<double>(r.bytes) / facts.layers);
        break;
      case RequestEnd::kFailed:
        ++s.failed;
        break;
      case RequestEnd::kStuck:
        ++s.stuck;
        break;
    }
    if (r.bad_bytes != 0) ++s.verify_failures;
  }
  s.exposed_p50_us = Percentile(exposed, 0.5);
  s.exposed_p99_us = Percentile(exposed, 0.99);
  s.exposed_max_us = exposed.empty() ? 0 : *std::max_element(exposed.begin(), exposed.end());
  s.layer_bytes_p50 = Percentile(layer_bytes, 0.5);
  s.bytes_per_s = facts.seconds > 0 ? static_cast<double>(s.bytes) / facts.seconds : 0;
  s.blocks_leaked = facts.blocks_leaked;
  for (const WorkerRecord& w : workers) {
    if (w.killed) continue;
    s.blocks_leaked += w.held_blocks;
    if (!w.alive) s.problems.push_back(fmt::format("worker {} died", w.id));
    if (w.pending != 0)
      s.problems.push_back(fmt::format("worker {} left {} requests pending", w.id, w.pending));
  }
  if (s.stuck) s.problems.push_back(fmt::format("{} requests stuck", s.stuck));
  if (s.verify_failures)
    s.problems.push_back(fmt::format("{} requests failed verification", s.verify_failures));
  if (s.blocks_leaked) s.problems.push_back(fmt::format("{} blocks leaked", s.blocks_leaked));
  if (s.failed && !facts.fault_run)
    s.problems.push_back(fmt::format("{} requests failed", s.failed));
  if (facts.fault_run && facts.killed.empty()) s.problems.push_back("no worker was killed");
  s.ok = s.problems.empty();
  return s;
}

nlohmann::json ToJson(const Summary& s, const std::vector<WorkerRecord>& workers,
                      const RunFacts& facts) {
  nlohmann::json j = {
      {"ok", s.ok},
      {"model", facts.model},
      {"mode", facts.mode},
      {"transport", facts.transport},
      {"memory", facts.memory},
      {"shape", facts.shape},
      {"seconds", facts.seconds},
      {"requests", s.requests},
      {"done", s.done},
      {"failed", s.failed},
      {"stuck", s.stuck},
      {"verify_failures", s.verify_failures},
      {"blocks_leaked", s.blocks_leaked},
      {"exposed_us",
       {{"p50", s.exposed_p50_us}, {"p99", s.exposed_p99_us}, {"max", s.exposed_max_us}}},
      {"bytes", s.bytes},
      {"bytes_per_s", s.bytes_per_s},
      {"layers", facts.layers},
      {"layer_bytes_p50", s.layer_bytes_p50},
      {"killed", facts.killed},
      {"problems", s.problems},
  };
  nlohmann::json ws = nlohmann::json::array();
  for (const WorkerRecord& w : workers)
    ws.push_back({{"id", w.id},
                  {"role", w.prefill ? "prefill" : "decode"},
                  {"alive", w.alive},
                  {"killed", w.killed},
                  {"pending", w.pending},
                  {"held_blocks", w.held_blocks},
                  {"stats", w.stats}});
  j["workers"] = std::move(ws);
  return j;
}

void PrintText(std::FILE* out, const Summary& s, const std::vector<WorkerRecord>& workers,
               const RunFacts& facts) {
  fmt::print(out, "ferry pd: {} {} mode over {}, {} memory, {}, {:.2f} s\n", facts.model,
             facts.mode, facts.transport, facts.memory, facts.shape, facts.seconds);
  fmt::print(out, "requests: {} done, {} failed, {} stuck of {}{}\n", s.done, s.failed, s.stuck,
             s.requests, facts.killed.empty() ? "" : fmt::format(" (killed {})", facts.killed));
  fmt::print(
      out,
      "exposed transfer time after the last layer: p50 {:.0f} us, p99 {:.0f} us, max {:.0f} us\n",
      s.exposed_p50_us, s.exposed_p99_us, s.exposed_max_us);
  fmt::print(out,
             "moved {} of KV, {:.2f} GB/s over the run; verified: {} requests failed the check\n",
             FormatBytes(s.bytes), s.bytes_per_s / 1e9, s.verify_failures);
  fmt::print(out, "blocks leaked: {}\n", s.blocks_leaked);
  Table table;
  for (const char* title : {"worker", "state", "done", "failed", "aborted", "layers", "bytes",
                            "deferred", "peers lost", "pending"})
    table.AddColumn(title);
  for (const WorkerRecord& w : workers) {
    auto n = [&](const char* key) {
      auto it = w.stats.find(key);
      return it != w.stats.end() && it->is_number_unsigned() ? std::to_string(it->get<uint64_t>())
                                                             : "-";
    };
    const uint64_t layers =
        (w.stats.contains("layers_written") && w.stats["layers_written"].is_number_unsigned()
             ? w.stats["layers_written"].get<uint64_t>()
             : 0) +
        (w.stats.contains("layers_read") && w.stats["layers_read"].is_number_unsigned()
             ? w.stats["layers_read"].get<uint64_t>()
             : 0);
    table.AddRow(
        {w.id, w.killed ? "killed" : (w.alive ? "ok" : "DIED"), n("requests_done"),
         n("requests_failed"), n("requests_aborted"),
         w.stats.empty() ? "-" : std::to_string(layers),
         w.stats.contains("bytes") ? FormatBytes(w.stats.value("bytes", uint64_t{0})) : "-",
         n("layers_deferred"), n("peers_lost"), std::to_string(w.pending)});
  }
  table.Print(out);
  if (s.ok) {
    fmt::print(out, "OK: every request ended{}, every block verified and handed back\n",
               facts.fault_run ? " (done or failed)" : " done");
  } else {
    for (const std::string& p : s.problems) fmt::print(out, "FAILED: {}\n", p);
  }
}

}  // namespace ferry::tools::pd
