// A strict parser of safetensors headers (https://github.com/huggingface/safetensors: an
// 8-byte little-endian header length n, n bytes of JSON, then the tensor data).
//
// The JSON is an object; "__metadata__", if present, maps strings to strings; every other
// key names a tensor {"dtype": str, "shape": [uint...], "data_offsets": [begin, end]} with
// exactly those keys, offsets relative to the first byte after the header. Rejected with
// kInvalidArgument: a file shorter than 8 bytes, n < 2 or n > kMaxHeaderBytes or past the end
// of the file, JSON that does not parse (or does not start with '{'), unknown keys or dtypes,
// non-integer or negative numbers, rank > kMaxRank, element counts or byte sizes that overflow,
// data_offsets that are reversed, disagree with dtype x shape, run past the end of the file or
// overlap another tensor's.
//
// Thread safety: a pure function of its input.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::embed {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the safetensors crate's own limit
inline constexpr size_t kMaxRank = 8;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "BF16", "F16", "F32", "F8_E4M3", "U8", ...
  uint64_t element_bytes = 0;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // absolute file offsets of the tensor's bytes, [begin, end)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 // 8 + n
  std::vector<SafetensorsTensor> tensors;  // in order of their data
};

// Parses the header of a safetensors file whose bytes are `file` (a mapping of the whole file;
// only the header is read, the data's extent is checked against file.size()).
Result<SafetensorsHeader> ParseSafetensors(std::span<const uint8_t> file);

// Bytes of one element of a safetensors dtype name; 0 when the name is unknown.
uint64_t SafetensorsElementBytes(std::string_view dtype);

}  // namespace ferry::embed
