// libFuzzer target: the shm transport's socket message decoder on arbitrary bytes. Every
// input must be rejected with an error or decode to a message that encodes back to exactly
// the input; likewise a region's access data (UnpackAccess), which comes in a descriptor.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "transport/shm/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = ferry::internal::shm::Decode(data, size);
  if (m.ok()) {
    if (m->payload.size() > ferry::internal::shm::kMaxPayloadBytes) __builtin_trap();
    std::string again = ferry::internal::shm::Encode(m->header, m->payload);
    if (again != std::string_view(reinterpret_cast<const char*>(data), size)) __builtin_trap();
  }
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto a = ferry::internal::shm::UnpackAccess(bytes); a.ok()) {
    auto again = ferry::internal::shm::UnpackAccess(ferry::internal::shm::PackAccess(a->first, a->second));
    if (!again.ok() || *again != *a) __builtin_trap();
  }
  return 0;
}
