#include "transport/shm/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/memory_file.h"

namespace ferry::internal::shm {
namespace {

uint64_t* Word(std::byte* base, size_t offset) { return reinterpret_cast<uint64_t*>(base + offset); }
uint32_t* Word32(std::byte* base, size_t offset) { return reinterpret_cast<uint32_t*>(base + offset); }

}  // namespace

// ---- RingReader ------------------------------------------------------------------------------

Result<std::unique_ptr<RingReader>> RingReader::Create(uint64_t capacity, size_t max_message_bytes) {
  if (capacity < kMinRingBytes || capacity > kMaxRingBytes || !std::has_single_bit(capacity))
    return Status(Code::kInvalidArgument, "ring capacity " + std::to_string(capacity));
  std::unique_ptr<RingReader> r(new RingReader());
  r->capacity_ = capacity;
  r->max_message_bytes_ = RingMessageLimit(capacity, max_message_bytes);
  r->length_ = kRingControlBytes + capacity;
  Result<os::UniqueFd> fd = os::CreateMemoryFile("ferry-shm-ring", r->length_, /*final=*/true);
  if (!fd.ok()) return fd.status().WithContext("notification ring");
  r->fd_ = fd->release();
  Result<os::SharedMapping> m = os::SharedMapping::Map(r->fd_, 0, r->length_, MAP_POPULATE);
  if (!m.ok()) return Status(Code::kResourceExhausted, std::string(m.status().message())).WithContext("notification ring");
  r->base_ = m->data();
  m->Release();  // unmapped by the destructor
  *Word32(r->base_, kRingMagicOffset) = kRingMagic;
  *Word32(r->base_, kRingVersionOffset) = kRingVersion;
  *Word(r->base_, kRingCapacityOffset) = capacity;
  *Word(r->base_, kRingLimitOffset) = r->max_message_bytes_;
  return r;
}

RingReader::~RingReader() {
  if (base_ != nullptr) (void)os::Env::Current()->Munmap(base_, length_);
  if (fd_ >= 0) (void)os::Env::Current()->Close(fd_);
}

bool RingReader::Pending() const {
  if (broken_) return false;
  return __atomic_load_n(Word(base_, kRingHeadOffset), __ATOMIC_RELAXED) != tail_;
}

RingTake RingReader::Take(size_t max_records) {
  if (broken_) {
    RingTake t;
    t.tail = tail_;
    t.error = Status(Code::kDataLoss, "notification ring: no longer read");
    return t;
  }
  // The producer index, read once; TakeRecords checks it.
  const uint64_t head = __atomic_load_n(Word(base_, kRingHeadOffset), __ATOMIC_ACQUIRE);
  RingTake t = TakeRecords(std::span<const std::byte>(base_ + kRingControlBytes, capacity_), tail_, head,
                           max_message_bytes_, max_records);
  tail_ = t.tail;
  __atomic_store_n(Word(base_, kRingTailOffset), tail_, __ATOMIC_RELEASE);  // the room it freed
  if (!t.error.ok()) broken_ = true;
  return t;
}

bool RingReader::Arm() {
  if (broken_) return false;
  __atomic_store_n(Word(base_, kRingWaitingOffset), uint64_t{1}, __ATOMIC_SEQ_CST);
  return __atomic_load_n(Word(base_, kRingHeadOffset), __ATOMIC_SEQ_CST) != tail_;
}

void RingReader::Disarm() {
  if (!broken_) __atomic_store_n(Word(base_, kRingWaitingOffset), uint64_t{0}, __ATOMIC_RELAXED);
}

// ---- RingWriter ------------------------------------------------------------------------------

Result<std::unique_ptr<RingWriter>> RingWriter::Map(int fd, uint64_t capacity, uint64_t max_message_bytes) {
  if (capacity < kMinRingBytes || capacity > kMaxRingBytes || !std::has_single_bit(capacity))
    return Status(Code::kInvalidArgument, "the peer's notification ring has a bad capacity");
  if (max_message_bytes > RingMessageLimit(capacity, SIZE_MAX))
    return Status(Code::kInvalidArgument, "the peer's notification ring has a bad message limit");
  std::unique_ptr<RingWriter> w(new RingWriter());
  FERRY_ASSIGN_OR_RETURN(w->mapping_, Mapping::Map(fd, 0, kRingControlBytes + capacity));
  w->base_ = w->mapping_->base();
  w->capacity_ = capacity;
  w->max_message_bytes_ = static_cast<size_t>(max_message_bytes);
  // The receiver wrote these before passing the file; a mismatch is a peer of another kind.
  if (__atomic_load_n(Word32(w->base_, kRingMagicOffset), __ATOMIC_ACQUIRE) != kRingMagic ||
      __atomic_load_n(Word32(w->base_, kRingVersionOffset), __ATOMIC_RELAXED) != kRingVersion ||
      __atomic_load_n(Word(w->base_, kRingCapacityOffset), __ATOMIC_RELAXED) != capacity)
    return Status(Code::kInvalidArgument, "the peer's notification ring has a bad header");
  // A new ring starts empty, where the writer's own head_ starts.
  const uint64_t head = __atomic_load_n(Word(w->base_, kRingHeadOffset), __ATOMIC_RELAXED);
  const uint64_t tail = __atomic_load_n(Word(w->base_, kRingTailOffset), __ATOMIC_ACQUIRE);
  if (head != 0 || tail != 0) return Status(Code::kInvalidArgument, "the peer's notification ring is not new");
  return w;
}

Status RingWriter::Put(std::string_view message, uint64_t token, bool acked, bool* wake) {
  *wake = false;
  if (message.size() > max_message_bytes_)
    return Status(Code::kInvalidArgument, "notification of " + std::to_string(message.size()) +
                                              " bytes exceeds the receiver's limit of " +
                                              std::to_string(max_message_bytes_));
  const uint64_t span = RecordSpan(message.size());
  {
    MutexLock lock(&mu_);
    if (broken_) return Status(Code::kDataLoss, "the receiver's notification ring is corrupt");
    // The consumer index is read again only when the room known from the last read is short:
    // while it suffices, the cache line the receiver writes stays away from this path.
    if (span > capacity_ - (head_ - tail_seen_)) {
      // The receiver may be hostile too: its consumer index must lie within the ring behind
      // ours, and never go back.
      const uint64_t tail = __atomic_load_n(Word(base_, kRingTailOffset), __ATOMIC_ACQUIRE);
      if (head_ - tail > capacity_ || tail - tail_seen_ > head_ - tail_seen_ || (tail & 7) != 0) {
        broken_ = true;
        return Status(Code::kDataLoss, "the receiver's notification ring is corrupt");
      }
      tail_seen_ = tail;
      if (span > capacity_ - (head_ - tail)) return Status(Code::kResourceExhausted, "the receiver's notification backlog is full");
    }
    PutRecord(std::span<std::byte>(base_ + kRingControlBytes, capacity_), head_, message, token, acked);
    head_ += span;
    // Publishes the record (release), and orders the store before the load of `waiting`.
    __atomic_store_n(Word(base_, kRingHeadOffset), head_, __ATOMIC_SEQ_CST);
  }
  uint64_t* waiting = Word(base_, kRingWaitingOffset);
  if (__atomic_load_n(waiting, __ATOMIC_SEQ_CST) != 0 && __atomic_exchange_n(waiting, uint64_t{0}, __ATOMIC_SEQ_CST) != 0)
    *wake = true;
  return Status::Ok();
}

}  // namespace ferry::internal::shm
