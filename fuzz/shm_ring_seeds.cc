// Writes seed inputs for the notification ring fuzzer: `shm_ring_seeds DIR`. Each seed is
// [u64 tail][u64 head][u32 limit][u32 log2 of capacity / 64] and the ring's bytes.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "transport/shm/ring_format.h"

namespace {
using namespace ferry::internal::shm;

void Write(const std::string& path, uint64_t tail, uint64_t head, uint32_t limit, uint32_t log2,
           const std::vector<std::byte>& ring) {
  std::string out(24, '\0');
  std::memcpy(out.data(), &tail, 8);
  std::memcpy(out.data() + 8, &head, 8);
  std::memcpy(out.data() + 16, &limit, 4);
  std::memcpy(out.data() + 20, &log2, 4);
  out.append(reinterpret_cast<const char*>(ring.data()), ring.size());
  std::ofstream(path, std::ios::binary) << out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  // Three records, one asking for an answer, in a ring of 256 bytes.
  std::vector<std::byte> ring(256);
  uint64_t head = 0;
  for (const char* m : {"layer-0-done", "", "req-7 done"}) {
    PutRecord(ring, head, m, head == 0 ? 0 : 42, head != 0);
    head += RecordSpan(std::strlen(m));
  }
  Write(dir + "/three", 0, head, 1024, 2, ring);
  // A record that wraps around the end of a 64-byte ring.
  std::vector<std::byte> small(64);
  PutRecord(small, 40, "wrapping around", 0, false);
  Write(dir + "/wrap", 40, 40 + RecordSpan(15), 100, 0, small);
  // A record exactly as large as the ring.
  std::vector<std::byte> full(64);
  PutRecord(full, 0, std::string(48, 'f'), 0, false);
  Write(dir + "/full", 0, 64, 100, 0, full);
  // Violations: a producer index too far ahead, and a length over the limit.
  Write(dir + "/ahead", 0, 1 << 20, 1024, 2, ring);
  Write(dir + "/over_limit", 0, head, 4, 2, ring);
  return 0;
}
