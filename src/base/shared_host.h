// The process-wide directory of shareable host buffers (ferry::AllocateSharedHost): which
// address ranges of this process are backed by a memory file that a peer on this host can
// map, and where. The `shm` transport asks it whether a region it is given to register lies
// inside such a buffer.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>

namespace ferry::internal {

struct SharedSpan {
  int fd = -1;           // the buffer's memory file; owned by the buffer (dup it to keep it)
  uint64_t offset = 0;   // offset of the asked-for range inside the memory file
  uint64_t file_size = 0;
};

// Records [base, base + size) as backed by `fd` from offset 0. REQUIRES: no overlap with a
// buffer already recorded (the kernel never maps two live buffers at one address).
void AddSharedHost(const void* base, uint64_t size, int fd);
void RemoveSharedHost(const void* base);
// The buffer that holds all of [ptr, ptr + bytes), if any.
std::optional<SharedSpan> FindSharedHost(const void* ptr, uint64_t bytes);

}  // namespace ferry::internal
