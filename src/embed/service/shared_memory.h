// SharedMemory: a memfd mapped read-write, shared between a GPU worker (which creates it) and
// the embedding-offload service (which maps the descriptor it receives over the socket).
//
// Map() sizes the mapping from the descriptor itself (fstat), so a peer cannot make the
// service believe a region is larger than it is; Contains() checks registered offsets and
// sizes against it. The file is sealed against shrinking (F_SEAL_SHRINK) at creation, so a
// mapped page can never disappear under the service (a SIGBUS otherwise); Map() refuses a
// descriptor without that seal.
//
// Thread safety: the object is immutable after creation; the bytes are shared memory whose
// users agree on their own ordering (the protocol's flags).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/memory_file.h"
#include "embed/service/unix_socket.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class SharedMemory {
 public:
  // A new zero-filled memfd of `bytes` (> 0) bytes, named `name` (for /proc and debugging);
  // kResourceExhausted when the system cannot give it.
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& name, size_t bytes);
  // Maps a received memfd. kInvalidArgument for an empty file, one that is not sealed against
  // shrinking; a failing mmap is its errno's code (os::ErrnoCode).
  static Result<std::unique_ptr<SharedMemory>> Map(UniqueFd fd);
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  uint8_t* data() const { return reinterpret_cast<uint8_t*>(mapping_.data()); }
  size_t bytes() const { return mapping_.size(); }
  int fd() const { return fd_.get(); }
  // True when [offset, offset + bytes) lies inside the mapping (overflow-safe).
  bool Contains(uint64_t offset, uint64_t bytes) const {
    return offset <= this->bytes() && bytes <= this->bytes() - offset;
  }

 private:
  SharedMemory(UniqueFd fd, os::SharedMapping mapping)
      : fd_(std::move(fd)), mapping_(std::move(mapping)) {}
  UniqueFd fd_;
  os::SharedMapping mapping_;
};

}  // namespace ferry::embed::service
