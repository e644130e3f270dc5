// libFuzzer target: taking records out of a notification ring whose every byte a hostile peer
// wrote. Input: [u64 tail][u64 head][u32 limit][u32 ring bytes log2] then the ring's bytes
// (zero-padded to its capacity). Every input must either yield records that obey the ring's
// invariants or stop with kDataLoss, never read outside the ring, and agree with a second
// pass that writes the same records into a fresh ring and takes them again.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "transport/shm/ring_format.h"

namespace {
uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::internal::shm;
  if (size < 24) return 0;
  uint64_t tail = Load64(data) & ~uint64_t{7};
  const uint64_t head = Load64(data + 8);
  uint32_t limit, log2;
  std::memcpy(&limit, data + 16, 4);
  std::memcpy(&log2, data + 20, 4);
  const size_t capacity = size_t{1} << (6 + log2 % 7);  // 64 B .. 4 KiB
  limit %= 8192;
  // Exactly the capacity: ASan catches any read past the ring.
  std::vector<std::byte> ring(capacity);
  std::memcpy(ring.data(), data + 24, std::min(size - 24, capacity));
  RingTake t = TakeRecords(ring, tail, head, limit, 1 << 12);
  const uint64_t taken = t.tail - tail;
  if (taken > capacity || taken > head - tail) __builtin_trap();
  if (t.error.ok() && t.tail != head && t.records.size() < (1 << 12)) __builtin_trap();
  if (!t.error.ok() && t.error.code() != ferry::Code::kDataLoss) __builtin_trap();
  uint64_t spans = 0;
  for (const RingRecord& r : t.records) {
    if (r.message.size() > limit) __builtin_trap();
    if (!r.acked && r.token != 0) __builtin_trap();
    spans += RecordSpan(r.message.size());
  }
  if (spans != taken) __builtin_trap();
  // The same records, written by PutRecord, read back the same.
  std::vector<std::byte> again(capacity);
  uint64_t h = tail;
  for (const RingRecord& r : t.records) {
    PutRecord(again, h, r.message, r.token, r.acked);
    h += RecordSpan(r.message.size());
  }
  RingTake u = TakeRecords(again, tail, h, limit, 1 << 12);
  if (!u.error.ok() || u.records.size() != t.records.size() || u.tail != t.tail) __builtin_trap();
  for (size_t i = 0; i < u.records.size(); ++i)
    if (u.records[i].message != t.records[i].message || u.records[i].token != t.records[i].token ||
        u.records[i].acked != t.records[i].acked)
      __builtin_trap();
  return 0;
}
