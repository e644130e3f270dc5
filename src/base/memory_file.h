// Memory files (memfd) and shared mappings of them: the one helper behind the buffers of
// ferry::AllocateSharedHost, the `shm` transport's mappings of a peer's regions and the
// embedding service's shared inputs and outputs. Every call goes through the OS seam.
//
// A file made here is sealed against shrinking (and growing), and a received file is mapped
// only when so sealed: a page can never disappear under a mapping (a SIGBUS otherwise).
//
// Thread safety: free functions callable from any thread; a SharedMapping is a value owning
// its mapping (not to be moved from two threads at once); the bytes it maps are shared memory
// whose users agree on their own ordering.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/unique_fd.h"
#include "ferry/status.h"

namespace ferry::os {

// A new zero-filled memory file of `bytes` (> 0) bytes, named `name` (for /proc), sealed against
// shrinking and growing, and against further seals when `final` is set. kResourceExhausted
// when the system cannot give it.
Result<UniqueFd> CreateMemoryFile(const char* name, uint64_t bytes, bool final = false);
// The size of a received memory file, after checking that it is a regular file sealed against
// shrinking: kInvalidArgument otherwise.
Result<uint64_t> SealedFileSize(int fd);

class SharedMapping {
 public:
  // Maps [offset, offset + size) of `fd` shared read-write (pages around it included), with
  // `extra_flags` (e.g. MAP_POPULATE). The descriptor is not taken. kInvalidArgument for an
  // empty range; a failing mmap is its errno's code (os::ErrnoCode).
  static Result<SharedMapping> Map(int fd, uint64_t offset, uint64_t size, int extra_flags = 0);

  SharedMapping() = default;
  SharedMapping(SharedMapping&& o) noexcept { *this = static_cast<SharedMapping&&>(o); }
  SharedMapping& operator=(SharedMapping&& o) noexcept;
  ~SharedMapping() { Reset(); }
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The whole mapping (whole pages), which Release hands over and munmap takes.
  void* start() const { return start_; }
  size_t length() const { return length_; }
  // Gives the mapping up to the caller, who unmaps [start(), start() + length()).
  void Release();
  void Reset();

 private:
  void* start_ = nullptr;
  size_t length_ = 0;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace ferry::os
