// libFuzzer target: the safetensors header parser (src/embed/safetensors.h) on arbitrary file
// bytes. Every input must be rejected with kInvalidArgument or parse to tensors that lie inside
// the file, do not overlap, and whose byte size is dtype x shape.
#include <cstddef>
#include <cstdint>
#include <span>

#include "embed/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = ferry::embed::ParseSafetensors(std::span<const uint8_t>(data, size));
  if (!header.ok()) {
    if (header.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
    return 0;
  }
  uint64_t previous_end = header->data_start;
  for (const auto& t : header->tensors) {
    if (t.begin < previous_end || t.end < t.begin || t.end > size) __builtin_trap();
    uint64_t bytes = t.element_bytes;
    for (uint64_t d : t.shape) bytes *= d;  // cannot overflow: the parser checked
    if (bytes != t.end - t.begin) __builtin_trap();
    previous_end = t.end;
  }
  return 0;
}
