// When `ferry pd`'s requests arrive and how long their prompts are: Poisson arrivals at a rate
// (seeded, so a run can be repeated), or a trace file of prompt lengths with optional times.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools::pd {

// The longest prompt a request may have, in tokens.
inline constexpr uint64_t kMaxPromptTokens = 1 << 20;
inline constexpr uint64_t kMaxRequests = 1 << 20;

struct Arrival {
  double at_s = 0;  // seconds after the run's start
  uint64_t tokens = 0;
  friend bool operator==(const Arrival&, const Arrival&) = default;
};

struct TokenRange {
  uint64_t min = 0;
  uint64_t max = 0;
};
// "128" or "64..512": every length in [1, kMaxPromptTokens], min <= max.
Result<TokenRange> ParseTokenRange(std::string_view text);

// `count` requests; prompt lengths uniform in `tokens`; exponential gaps of mean 1/rate
// seconds, or every request at time 0 when rate is 0.
std::vector<Arrival> PoissonArrivals(uint64_t count, double rate, TokenRange tokens, uint64_t seed);

// A trace: one request a line, "TOKENS" or "SECONDS TOKENS" (the same form on every line);
// blank lines and lines starting with '#' are skipped. Lines without times get times from
// `rate` as PoissonArrivals does. The result is sorted by time. kInvalidArgument naming the
// line for anything malformed or out of range, or an empty trace.
Result<std::vector<Arrival>> ParseTrace(std::string_view text, double rate, uint64_t seed);

}  // namespace ferry::tools::pd
