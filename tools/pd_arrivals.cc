#include "pd_arrivals.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>
#include <string>

namespace ferry::tools::pd {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool ParseUint(std::string_view s, uint64_t* out) {
  s = Trim(s);
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double* out) {
  s = Trim(s);
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(*out);
}

// Exponential gaps of mean 1/rate (rate 0: every request at 0).
std::vector<double> Times(uint64_t count, double rate, std::mt19937_64& rng) {
  std::vector<double> at(count, 0.0);
  if (rate <= 0) return at;
  std::exponential_distribution<double> gap(rate);
  double t = 0;
  for (uint64_t i = 0; i < count; ++i) {
    t += gap(rng);
    at[i] = t;
  }
  return at;
}

}  // namespace

Result<TokenRange> ParseTokenRange(std::string_view text) {
  TokenRange r;
  const size_t dots = text.find("..");
  bool ok = dots == std::string_view::npos ? ParseUint(text, &r.min) && (r.max = r.min, true)
                                           : ParseUint(text.substr(0, dots), &r.min) &&
                                                 ParseUint(text.substr(dots + 2), &r.max);
  if (!ok || r.min == 0 || r.max > kMaxPromptTokens || r.min > r.max)
    return Status(
        Code::kInvalidArgument,
        fmt::format("--prompt-tokens must be N or MIN..MAX with 1 <= MIN <= MAX <= {}, not '{}'",
                    kMaxPromptTokens, text));
  return r;
}

std::vector<Arrival> PoissonArrivals(uint64_t count, double rate, TokenRange tokens,
                                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> at = Times(count, rate, rng);
  std::uniform_int_distribution<uint64_t> length(tokens.min, tokens.max);
  std::vector<Arrival> out(count);
  for (uint64_t i = 0; i < count; ++i) out[i] = Arrival{at[i], length(rng)};
  return out;
}

Result<std::vector<Arrival>> ParseTrace(std::string_view text, double rate, uint64_t seed) {
  std::vector<Arrival> out;
  int with_times = -1;  // unknown until the first request line
  uint64_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](std::string_view why) {
      return Status(Code::kInvalidArgument,
                    fmt::format("--trace: line {}: {} ('{}')", line_no, why, line));
    };
    const size_t space = line.find_first_of(" \t");
    const bool timed = space != std::string_view::npos;
    if (with_times == -1) with_times = timed ? 1 : 0;
    if (timed != (with_times == 1))
      return bad("every line gives TOKENS, or every line SECONDS TOKENS");
    Arrival a;
    if (timed) {
      if (!ParseDouble(line.substr(0, space), &a.at_s) || a.at_s < 0 || a.at_s > 86400)
        return bad("the time must be seconds in [0, 86400]");
      if (!ParseUint(line.substr(space + 1), &a.tokens))
        return bad("the prompt length must be a whole number");
    } else if (!ParseUint(line, &a.tokens)) {
      return bad("the prompt length must be a whole number");
    }
    if (a.tokens == 0 || a.tokens > kMaxPromptTokens)
      return bad(fmt::format("the prompt length must be in [1, {}]", kMaxPromptTokens));
    if (out.size() >= kMaxRequests) return bad(fmt::format("more than {} requests", kMaxRequests));
    out.push_back(a);
  }
  if (out.empty()) return Status(Code::kInvalidArgument, "--trace: no requests in the file");
  if (with_times == 0) {
    std::mt19937_64 rng(seed);
    std::vector<double> at = Times(out.size(), rate, rng);
    for (size_t i = 0; i < out.size(); ++i) out[i].at_s = at[i];
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Arrival& a, const Arrival& b) { return a.at_s < b.at_s; });
  return out;
}

}  // namespace ferry::tools::pd
