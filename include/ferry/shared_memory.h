// Shareable host memory: host memory that other processes of this host can map, so that the
// `shm` transport moves bytes into and out of it with a plain memcpy in the peer process (no
// system call per transfer, no copy through a bounce buffer).
//
// AllocateSharedHost() creates an anonymous memory file (memfd), sized, sealed against
// shrinking and growing (a peer's mapping can never lose its pages), mapped MAP_SHARED and
// pre-faulted, with transparent-hugepage advice where the kernel allows it. Register any range
// inside the buffer with Engine::RegisterMemory (kHost) and peers on this host reach it through
// `shm`; memory from anywhere else goes through the other transports (e.g. `ucx`).
//
// Deregistering a region revokes it: peers refuse new transfers on it at once, and unmap it once
// their running copies end. A peer that does not confirm within ShmOptions::revoke_timeout (a
// stopped process) is disconnected and a warning is logged; a copy it had already started may
// still land when it resumes. Freeing the buffer is always safe (a late copy then lands in pages
// only that peer still maps); reusing it for other data right after such a warning is not.
//
// Thread safety: HostBuffer is a move-only value; AllocateSharedHost may be called from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/status.h"

namespace ferry {

class HostBuffer {
 public:
  HostBuffer() = default;  // empty: data() == nullptr, size() == 0
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend Result<HostBuffer> AllocateSharedHost(uint64_t bytes);
  void Reset();
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;    // as asked for
  uint64_t mapped_ = 0;  // size_ rounded up to whole pages
  int fd_ = -1;
};

// `bytes` of zeroed host memory that peers on this host can map.
// kInvalidArgument for 0 bytes; kResourceExhausted when the memory cannot be had.
// REQUIRES: the buffer outlives every registration of memory inside it (deregister first).
Result<HostBuffer> AllocateSharedHost(uint64_t bytes);

}  // namespace ferry
