#include "units.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>

namespace ferry::tools {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    size_t at = s.find(sep);
    out.push_back(Trim(s.substr(0, at)));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}

Status Bad(std::string_view what, std::string_view text) {
  return Status(Code::kInvalidArgument, fmt::format("bad {} '{}'", what, text));
}

Result<uint64_t> ParseCount(std::string_view text) {
  text = Trim(text);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0)
    return Bad("count", text);
  return value;
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view text) {
  text = Trim(text);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return Bad("size", text);
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.substr(1) == "IB") unit.resize(1);
  if (unit.size() == 2 && unit[1] == 'B' && unit[0] != 'B') unit.resize(1);
  int shift = 0;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K")
    shift = 10;
  else if (unit == "M")
    shift = 20;
  else if (unit == "G")
    shift = 30;
  else if (unit == "T")
    shift = 40;
  else
    return Bad("size unit in", text);
  if (value == 0 || value > (UINT64_MAX >> shift)) return Bad("size", text);
  return value << shift;
}

Result<std::vector<uint64_t>> ParseBytesList(std::string_view text) {
  std::vector<uint64_t> out;
  for (std::string_view item : Split(text, ',')) {
    size_t dots = item.find("..");
    if (dots == std::string_view::npos) {
      FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseBytes(item));
      out.push_back(v);
      continue;
    }
    std::string_view last = item.substr(dots + 2);
    uint64_t factor = 4;
    if (size_t colon = last.find(':'); colon != std::string_view::npos) {
      FERRY_ASSIGN_OR_RETURN(factor, ParseCount(last.substr(colon + 1)));
      last = last.substr(0, colon);
      if (factor < 2) return Bad("range step in", item);
    }
    FERRY_ASSIGN_OR_RETURN(uint64_t lo, ParseBytes(item.substr(0, dots)));
    FERRY_ASSIGN_OR_RETURN(uint64_t hi, ParseBytes(last));
    if (lo > hi) return Bad("range", item);
    for (uint64_t v = lo; v <= hi; v *= factor) {
      out.push_back(v);
      if (v > hi / factor) break;
    }
  }
  return out;
}

Result<std::vector<uint64_t>> ParseCountList(std::string_view text) {
  std::vector<uint64_t> out;
  for (std::string_view item : Split(text, ',')) {
    FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseCount(item));
    out.push_back(v);
  }
  return out;
}

Result<std::chrono::nanoseconds> ParseSeconds(double seconds, std::string_view flag, bool allow_zero,
                                              std::chrono::nanoseconds max) {
  const double max_s = std::chrono::duration<double>(max).count();
  // Written so that NaN fails every comparison and lands here too.
  if (!(seconds >= 0 && seconds <= max_s) || (seconds == 0 && !allow_zero))
    return Status(Code::kInvalidArgument,
                  fmt::format("{} must be a number of seconds in {}{}, {}], not {}", flag, allow_zero ? "[" : "(",
                              0, max_s, seconds));
  auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
  if (seconds > 0 && d <= std::chrono::nanoseconds::zero()) d = std::chrono::nanoseconds(1);
  return d;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  if (value == static_cast<double>(static_cast<uint64_t>(value)))
    return fmt::format("{} {}", static_cast<uint64_t>(value), kUnits[unit]);
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace ferry::tools
