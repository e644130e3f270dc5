// The end of a `ferry pd` run: what happened to every request and worker, summarised as text
// or as one JSON object, and the exit status it earns.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ferry::tools::pd {

enum class RequestEnd : uint8_t { kDone, kFailed, kStuck };

struct RequestRecord {
  uint64_t id = 0;
  uint64_t tokens = 0;
  RequestEnd end = RequestEnd::kStuck;
  double exposed_us =
      -1;              // Seal (or HoldForRead) of the last producer rank to the decode side's end
  uint64_t bytes = 0;  // KV bytes the decode instance received
  uint64_t bad_bytes = 0;  // bytes that did not verify
  std::string why;         // when not done
};

struct WorkerRecord {
  std::string id;  // "p0/dp0/tp1"
  bool prefill = true;
  bool alive = true;         // answered at the end
  bool killed = false;       // by --kill-prefill-after or --kill-decode-after
  uint64_t pending = 0;      // requests the connector had not ended
  uint64_t held_blocks = 0;  // blocks of requests this worker was still in
  nlohmann::json stats;      // the connector's counters
};

struct RunFacts {
  std::string model;
  std::string mode;
  std::string transport;
  std::string memory;
  std::string shape;  // "1P(tp2) -> 1D(tp1)"
  uint32_t layers = 0;
  double seconds = 0;
  uint64_t blocks_leaked = 0;  // instance blocks not back in their free lists (instances all alive)
  bool fault_run = false;
  std::string killed;  // the workers killed, if any ("p0/dp0/tp0, d1/dp0/tp0")
};

struct Summary {
  uint64_t requests = 0;
  uint64_t done = 0;
  uint64_t failed = 0;
  uint64_t stuck = 0;
  uint64_t verify_failures = 0;
  uint64_t blocks_leaked = 0;
  double exposed_p50_us = 0;
  double exposed_p99_us = 0;
  double exposed_max_us = 0;
  uint64_t bytes = 0;
  double bytes_per_s = 0;
  double layer_bytes_p50 = 0;  // KV bytes one layer of a done request moved (median)
  bool ok = false;
  std::vector<std::string> problems;  // why not ok, for humans
};

// The run is ok when no request is stuck or failed a check, nothing leaked, every surviving
// worker ended every request, and (outside a fault run) every request is done.
Summary Summarize(const std::vector<RequestRecord>& requests,
                  const std::vector<WorkerRecord>& workers, const RunFacts& facts);

nlohmann::json ToJson(const Summary& s, const std::vector<WorkerRecord>& workers,
                      const RunFacts& facts);
void PrintText(std::FILE* out, const Summary& s, const std::vector<WorkerRecord>& workers,
               const RunFacts& facts);

// Nearest-rank percentile q in (0, 1] of `values` (sorted here); 0 for none.
double Percentile(std::vector<double> values, double q);

}  // namespace ferry::tools::pd
