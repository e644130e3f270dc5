#include "transport/shm/ring_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/endian.h"

namespace ferry::internal::shm {
namespace {

Status Bad(const std::string& what) { return Status(Code::kDataLoss, "notification ring: " + what); }

// Copies `n` bytes at ring index `at` into `out`, wrapping at the end. REQUIRES n <= size.
void CopyOut(std::span<const std::byte> ring, uint64_t at, void* out, size_t n) {
  const uint64_t cap = ring.size();
  const size_t pos = static_cast<size_t>(at & (cap - 1));
  const size_t first = std::min<size_t>(n, cap - pos);
  std::memcpy(out, ring.data() + pos, first);
  if (first < n) std::memcpy(static_cast<char*>(out) + first, ring.data(), n - first);
}

void CopyIn(std::span<std::byte> ring, uint64_t at, const void* in, size_t n) {
  const uint64_t cap = ring.size();
  const size_t pos = static_cast<size_t>(at & (cap - 1));
  const size_t first = std::min<size_t>(n, cap - pos);
  std::memcpy(ring.data() + pos, in, first);
  if (first < n) std::memcpy(ring.data(), static_cast<const char*>(in) + first, n - first);
}

}  // namespace

uint64_t RingCapacityFor(size_t max_message_bytes, size_t max_pending) {
  const uint64_t two_largest = 2 * RecordSpan(std::min<uint64_t>(max_message_bytes, kMaxRingBytes));
  const uint64_t burst = std::min<uint64_t>(max_pending, 4096) * 48;
  const uint64_t want = std::max<uint64_t>({two_largest, burst, uint64_t{64} << 10});
  return std::min(std::bit_ceil(want), kMaxRingBytes);
}

size_t RingMessageLimit(uint64_t capacity, size_t limit) {
  // Two of the largest fit, so that one in flight never blocks the next for long.
  if (capacity < 2 * kRecordHeaderBytes) return 0;
  const uint64_t half = capacity / 2 - kRecordHeaderBytes;
  return static_cast<size_t>(std::min<uint64_t>(limit, half));
}

RingTake TakeRecords(std::span<const std::byte> ring, uint64_t tail, uint64_t head,
                     size_t max_message_bytes, size_t max_records) {
  RingTake out;
  out.tail = tail;
  const uint64_t cap = ring.size();
  if (cap < kMinRingBytes || !std::has_single_bit(cap) || (tail & 7) != 0) {
    out.error = Bad("bad capacity or consumer index");
    return out;
  }
  const uint64_t published = head - tail;  // modulo 2^64: a head behind the tail is huge
  if (published > cap) {
    out.error = Bad("producer index " + std::to_string(head) + " is not within " + std::to_string(cap) +
                    " bytes ahead of the consumer index " + std::to_string(tail));
    return out;
  }
  if ((published & 7) != 0) {
    out.error = Bad("producer index is not a multiple of 8");
    return out;
  }
  uint64_t at = tail;
  while (at != head && out.records.size() < max_records) {
    const uint64_t left = head - at;
    if (left < kRecordHeaderBytes) {
      out.error = Bad("a record header is cut short by the producer index");
      break;
    }
    uint8_t h[kRecordHeaderBytes];  // copied once: the peer may change the ring as we read
    CopyOut(ring, at, h, sizeof(h));
    const uint32_t size = LoadLe32(h);
    const uint32_t flags = LoadLe32(h + 4);
    const uint64_t token = LoadLe64(h + 8);
    if ((flags & ~kRecordAcked) != 0 || ((flags & kRecordAcked) == 0 && token != 0)) {
      out.error = Bad("a record with unknown flags");
      break;
    }
    if (size > max_message_bytes) {
      out.error = Bad("a record of " + std::to_string(size) + " bytes, over the limit of " +
                      std::to_string(max_message_bytes));
      break;
    }
    const uint64_t span = RecordSpan(size);
    if (span > left) {
      out.error = Bad("a record of " + std::to_string(size) + " bytes runs past the producer index");
      break;
    }
    RingRecord r;
    r.message.resize(size);
    CopyOut(ring, at + kRecordHeaderBytes, r.message.data(), size);
    r.token = token;
    r.acked = (flags & kRecordAcked) != 0;
    out.records.push_back(std::move(r));
    at += span;
  }
  out.tail = at;
  return out;
}

void PutRecord(std::span<std::byte> ring, uint64_t head, std::string_view message, uint64_t token,
               bool acked) {
  uint8_t h[kRecordHeaderBytes];
  StoreLe32(h, static_cast<uint32_t>(message.size()));
  StoreLe32(h + 4, acked ? kRecordAcked : 0);
  StoreLe64(h + 8, acked ? token : 0);
  CopyIn(ring, head, h, sizeof(h));
  CopyIn(ring, head + kRecordHeaderBytes, message.data(), message.size());
  const uint64_t pad = RecordSpan(message.size()) - kRecordHeaderBytes - message.size();
  static constexpr uint8_t kZeros[8] = {};
  if (pad != 0) CopyIn(ring, head + kRecordHeaderBytes + message.size(), kZeros, pad);
}

}  // namespace ferry::internal::shm
