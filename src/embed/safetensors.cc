#include "embed/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/endian.h"

namespace ferry::embed {
namespace {

using Json = nlohmann::json;

Status Bad(std::string message) {
  return Status(Code::kInvalidArgument, "safetensors: " + std::move(message));
}

Result<uint64_t> Unsigned(const Json& j, const std::string& what) {
  if (!j.is_number_unsigned()) return Bad(what + " must be a non-negative integer");
  return j.get<uint64_t>();
}

Result<SafetensorsTensor> ParseTensor(const std::string& name, const Json& j, uint64_t data_bytes,
                                      uint64_t data_start) {
  if (name.empty()) return Bad("a tensor has an empty name");
  if (!j.is_object()) return Bad("tensor \"" + name + "\" must be an object");
  const std::string where = "tensor \"" + name + "\": ";
  for (const auto& [key, value] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return Bad(where + "unknown key \"" + key + "\"");
  }
  auto dtype = j.find("dtype");
  auto shape = j.find("shape");
  auto offsets = j.find("data_offsets");
  if (dtype == j.end() || shape == j.end() || offsets == j.end())
    return Bad(where + "needs dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = name;
  if (!dtype->is_string()) return Bad(where + "dtype must be a string");
  t.dtype = dtype->get_ref<const std::string&>();
  t.element_bytes = SafetensorsElementBytes(t.dtype);
  if (t.element_bytes == 0) return Bad(where + "unknown dtype \"" + t.dtype + "\"");
  if (!shape->is_array() || shape->size() > kMaxRank)
    return Bad(where + "shape must be an array of at most " + std::to_string(kMaxRank) +
               " dimensions");
  uint64_t bytes = t.element_bytes;
  for (const Json& dim : *shape) {
    FERRY_ASSIGN_OR_RETURN(uint64_t d, Unsigned(dim, where + "a dimension"));
    if (__builtin_mul_overflow(bytes, d, &bytes)) return Bad(where + "size overflows");
    t.shape.push_back(d);
  }
  if (!offsets->is_array() || offsets->size() != 2)
    return Bad(where + "data_offsets must be [begin, end]");
  FERRY_ASSIGN_OR_RETURN(uint64_t begin, Unsigned((*offsets)[0], where + "data_offsets[0]"));
  FERRY_ASSIGN_OR_RETURN(uint64_t end, Unsigned((*offsets)[1], where + "data_offsets[1]"));
  if (begin > end) return Bad(where + "data_offsets are reversed");
  if (end > data_bytes)
    return Bad(where + "data ends at " + std::to_string(end) + ", past the " +
               std::to_string(data_bytes) + " data bytes of the file");
  if (end - begin != bytes)
    return Bad(where + "data_offsets span " + std::to_string(end - begin) + " bytes; dtype x " +
               "shape needs " + std::to_string(bytes));
  t.begin = data_start + begin;
  t.end = data_start + end;
  return t;
}

Result<SafetensorsHeader> Parse(std::span<const uint8_t> file) {
  if (file.size() < 8)
    return Bad("file of " + std::to_string(file.size()) + " bytes has no header");
  const uint64_t n = LoadLe64(file.data());  // the header's length, little-endian
  if (n < 2 || n > kMaxHeaderBytes)
    return Bad("header length " + std::to_string(n) + " is outside [2, " +
               std::to_string(kMaxHeaderBytes) + "]");
  if (n > file.size() - 8)
    return Bad("header length " + std::to_string(n) + " runs past the end of the " +
               std::to_string(file.size()) + "-byte file");
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  if (text[0] != '{') return Bad("header does not start with '{'");
  Json root = Json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Bad("header is not a JSON object");

  SafetensorsHeader header;
  header.data_start = 8 + n;
  const uint64_t data_bytes = file.size() - header.data_start;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Bad("__metadata__ must be an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return Bad("__metadata__[\"" + mk + "\"] must be a string");
      }
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(SafetensorsTensor t,
                           ParseTensor(key, value, data_bytes, header.data_start));
    header.tensors.push_back(std::move(t));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  for (size_t i = 1; i < header.tensors.size(); ++i) {
    const auto& prev = header.tensors[i - 1];
    const auto& cur = header.tensors[i];
    if (cur.begin < prev.end)
      return Bad("tensors \"" + prev.name + "\" and \"" + cur.name + "\" overlap");
  }
  return header;
}

}  // namespace

uint64_t SafetensorsElementBytes(std::string_view dtype) {
  static constexpr std::pair<std::string_view, uint64_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

Result<SafetensorsHeader> ParseSafetensors(std::span<const uint8_t> file) {
  // The parse is non-throwing; what remains (allocation failure) is caught here so no
  // exception leaves the library.
  try {
    return Parse(file);
  } catch (const std::exception& e) {
    return Bad(std::string("header could not be parsed: ") + e.what());
  }
}

}  // namespace ferry::embed
