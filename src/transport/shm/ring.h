// The two ends of a notification ring (layout and invariants: ring_format.h). The receiver
// (a target engine) makes one per connection when the initiator says hello and passes its
// memory file over the socket (kRing); the initiator maps it and writes its notifications
// into it. No syscall on either side per message: the receiver's I/O thread sets `waiting`
// before it sleeps, and only then does the sender wake it (Dekker-style: each side stores its
// own word, then a full fence, then loads the other's).
//
// Thread safety: RingReader is not thread-safe (its owner, Core, serialises every call under
// one mutex). RingWriter::Put may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "base/mutex.h"
#include "ferry/status.h"
#include "transport/shm/mapping.h"
#include "transport/shm/ring_format.h"

namespace ferry::internal::shm {

class RingReader {
 public:
  // A fresh ring of `capacity` bytes (a power of two) for messages of up to `max_message_bytes`.
  static Result<std::unique_ptr<RingReader>> Create(uint64_t capacity, size_t max_message_bytes);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  int fd() const { return fd_; }  // the memory file, sealed, for the sender
  uint64_t capacity() const { return capacity_; }
  size_t max_message_bytes() const { return max_message_bytes_; }
  bool broken() const { return broken_; }

  // Whether the sender published records not taken yet: one load from the ring.
  bool Pending() const;
  // Takes what the sender published (at most `max_records` records). On a violation the
  // records before it are returned with the error, and the ring is not read again.
  RingTake Take(size_t max_records);
  // Before the receiver sleeps: sets `waiting`, then tells whether records are pending (the
  // receiver must not sleep then). Disarm() after waking.
  bool Arm();
  void Disarm();

 private:
  RingReader() = default;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t length_ = 0;
  uint64_t capacity_ = 0;
  size_t max_message_bytes_ = 0;
  uint64_t tail_ = 0;  // the receiver's own copy: the shared word is never read back
  bool broken_ = false;
};

class RingWriter {
 public:
  // Maps the receiver's ring from `fd` (not taken) after checking its seals, size and header
  // against `capacity` and `max_message_bytes` from the kRing message.
  static Result<std::unique_ptr<RingWriter>> Map(int fd, uint64_t capacity, uint64_t max_message_bytes);

  size_t max_message_bytes() const { return max_message_bytes_; }

  // Publishes one record. kInvalidArgument: larger than the receiver takes; kResourceExhausted:
  // no room (the receiver is behind); kDataLoss: the receiver's consumer index is corrupt
  // (fail the connection). `*wake` is set when the receiver sleeps and must be woken.
  Status Put(std::string_view message, uint64_t token, bool acked, bool* wake) EXCLUDES(mu_);

 private:
  RingWriter() = default;
  std::shared_ptr<Mapping> mapping_;
  std::byte* base_ = nullptr;
  uint64_t capacity_ = 0;
  size_t max_message_bytes_ = 0;
  Mutex mu_;
  uint64_t head_ GUARDED_BY(mu_) = 0;       // the sender's own copy
  uint64_t tail_seen_ GUARDED_BY(mu_) = 0;  // the consumer index last read (and checked)
  bool broken_ GUARDED_BY(mu_) = false;
};

}  // namespace ferry::internal::shm
