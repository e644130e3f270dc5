// Byte sizes and lists on the command line: "4096", "4K", "64KiB", "1M", "4K..64M" (powers of 4)
// and "4K..64M:2" (powers of 2); binary units only (K = 1024). Times given in seconds.
//
// Thread safety: free functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools {

// "64K", "64KiB", "64k", "65536" -> 65536. Zero and overflow are errors.
Result<uint64_t> ParseBytes(std::string_view text);
// Comma-separated sizes or ranges: "4K,1M", "4K..64M", "4K..64M:2"; kept in the given order.
Result<std::vector<uint64_t>> ParseBytesList(std::string_view text);
// Comma-separated positive integers: "1,16,256".
Result<std::vector<uint64_t>> ParseCountList(std::string_view text);

// The longest time a flag may give: a day.
inline constexpr std::chrono::hours kMaxFlagTime{24};

// A time given in seconds (a flag's double) as nanoseconds. NaN, infinities, negative values,
// zero (unless `allow_zero`) and more than `max` are kInvalidArgument, naming `flag`. A
// positive time under a nanosecond is one nanosecond.
Result<std::chrono::nanoseconds> ParseSeconds(double seconds, std::string_view flag, bool allow_zero = false,
                                              std::chrono::nanoseconds max = kMaxFlagTime);

// 65536 -> "64 KiB", 1536 -> "1.5 KiB", 100 -> "100 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace ferry::tools
