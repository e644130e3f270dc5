// The layout of a notification ring and the pure functions that put records into it and take
// them out. A ring is one memory file per connection, made by the receiver (the target) and
// mapped by the sender (the initiator): a control block, then `capacity` bytes of records.
//
// Invariants (indices are byte counts since the ring was made; they only grow, modulo 2^64):
//   tail <= head <= tail + capacity, both multiples of 8; capacity is a power of two >= 64.
//   The bytes of [tail, head) (at position index % capacity, wrapping at the end) are records
//   the sender published and the receiver has not taken; the sender writes only outside them.
//   A record: a 16-byte header {u32 size, u32 flags, u64 token} (little-endian) and `size`
//   bytes of message, padded to a multiple of 8. Header and message may wrap at the end.
//   flags: kRecordAcked or 0; token is 0 unless acked (the receiver then answers kAck with it).
// The control block has a cache line per writer:
//   [0]   receiver: magic, version, capacity, largest message the receiver takes
//   [64]  receiver: tail (the consumer index, so the sender knows the free space)
//   [128] sender:   head (the producer index)
//   [192] both:     waiting: the receiver sets it before it sleeps, the sender clears it and
//                   then wakes the receiver through the socket (kWake)
// Nothing the peer writes is trusted: TakeRecords() checks the producer index, copies each
// header once before looking at it, and rejects any record that breaks the invariants.
//
// Thread safety: pure functions of their arguments; callers serialise access to a ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::internal::shm {

inline constexpr uint32_t kRingMagic = 0x474e5246;  // "FRNG"
inline constexpr uint32_t kRingVersion = 1;  // of the ring's control block and record layout
inline constexpr size_t kRingControlBytes = 256;
inline constexpr size_t kRingMagicOffset = 0;
inline constexpr size_t kRingVersionOffset = 4;
inline constexpr size_t kRingCapacityOffset = 8;
inline constexpr size_t kRingLimitOffset = 16;
inline constexpr size_t kRingTailOffset = 64;
inline constexpr size_t kRingHeadOffset = 128;
inline constexpr size_t kRingWaitingOffset = 192;
inline constexpr size_t kRecordHeaderBytes = 16;
inline constexpr uint32_t kRecordAcked = 1;
inline constexpr uint64_t kMinRingBytes = 64;
inline constexpr uint64_t kMaxRingBytes = uint64_t{64} << 20;

// Bytes a record of a `size`-byte message takes in the ring.
constexpr uint64_t RecordSpan(uint64_t size) { return kRecordHeaderBytes + ((size + 7) & ~uint64_t{7}); }

// The ring capacity for a receiver that takes messages of up to `max_message_bytes` and keeps
// up to `max_pending` of them: room for two of the largest, and for a burst of small ones (up
// to 4096 of 48 bytes); a power of two within [64 KiB, kMaxRingBytes].
uint64_t RingCapacityFor(size_t max_message_bytes, size_t max_pending);
// The largest message a ring of `capacity` carries for a receiver whose limit is `limit`.
size_t RingMessageLimit(uint64_t capacity, size_t limit);

struct RingRecord {
  std::string message;
  uint64_t token = 0;
  bool acked = false;
};

struct RingTake {
  std::vector<RingRecord> records;  // taken, in order, before any violation
  uint64_t tail = 0;                // past the last record taken
  Status error;                     // kDataLoss on a violation: stop reading this ring
};

// Takes the records of [tail, head) out of `ring` (the record area: capacity = ring.size()),
// at most `max_records`, each of at most `max_message_bytes`. Reads only inside `ring`, each
// header once; any byte may change while it runs (a peer writing) without harm.
RingTake TakeRecords(std::span<const std::byte> ring, uint64_t tail, uint64_t head,
                     size_t max_message_bytes, size_t max_records);

// Writes one record at `head`. REQUIRES: RecordSpan(message.size()) <= ring.size() - (head -
// tail) (the caller checked the free space), head a multiple of 8, ring.size() a power of two.
void PutRecord(std::span<std::byte> ring, uint64_t head, std::string_view message, uint64_t token,
               bool acked);

}  // namespace ferry::internal::shm
