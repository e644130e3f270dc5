// libFuzzer target: MemoryDesc::Unpack and EngineDesc::Unpack on arbitrary bytes. Every input
// must be rejected with an error or decode to a descriptor that packs and decodes to itself.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/descriptors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto m = ferry::MemoryDesc::Unpack(bytes); m.ok()) {
    auto again = ferry::MemoryDesc::Unpack(m->Pack());
    if (!again.ok() || !(*again == *m)) __builtin_trap();
  }
  if (auto e = ferry::EngineDesc::Unpack(bytes); e.ok()) {
    auto again = ferry::EngineDesc::Unpack(e->Pack());
    if (!again.ok() || !(*again == *e)) __builtin_trap();
  }
  return 0;
}
