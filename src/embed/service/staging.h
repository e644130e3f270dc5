// Staging: a data-parallel group's buffer for rows gathered on their way to GPU outputs (the
// copy pump's source), sized by the steps that need it rather than by a client's registered
// capacity: a host-mode group, whose rows go straight into rank 0's shared output, has none.
//
// Reserve(bytes) grows the buffer to the next power of two at or above `bytes` (at most
// `limit`, the group's max_tokens x token_bytes), so that a group whose steps grow re-pins
// O(log) times; the bytes are not zeroed (every step writes the rows it copies) and not kept
// across growth. Page-locked (cuda::HostRegister) when asked, for asynchronous copies. The
// bytes held are added to and removed from a counter the server reports (ServerMemory).
//
// Thread safety: one thread (the group's worker) uses a Staging; the counter is atomic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ferry/status.h"

namespace ferry::embed::service {

class Staging {
 public:
  explicit Staging(std::atomic<uint64_t>* held) : held_(held) {}
  ~Staging() { Release(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // REQUIRES: no copy still reads the buffer (it may move). kResourceExhausted without memory;
  // the CUDA error when page-locking fails (the buffer is then released).
  Status Reserve(size_t bytes, size_t limit, bool pinned);
  void Release();
  uint8_t* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }

 private:
  std::atomic<uint64_t>* held_;
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
  bool pinned_ = false;
};

}  // namespace ferry::embed::service
