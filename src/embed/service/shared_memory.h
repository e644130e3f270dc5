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

#include "embed/service/unix_socket.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class SharedMemory {
 public:
  // A new zero-filled memfd of `bytes` (> 0) bytes, named `name` (for /proc and debugging).
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& name, size_t bytes);
  // Maps a received memfd. kInvalidArgument for an empty file, one that is not sealed against
  // shrinking, or a descriptor that cannot be mapped shared read-write.
  static Result<std::unique_ptr<SharedMemory>> Map(UniqueFd fd);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }
  // True when [offset, offset + bytes) lies inside the mapping (overflow-safe).
  bool Contains(uint64_t offset, uint64_t bytes) const {
    return offset <= bytes_ && bytes <= bytes_ - offset;
  }

 private:
  SharedMemory(UniqueFd fd, uint8_t* data, size_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  UniqueFd fd_;
  uint8_t* data_;
  size_t bytes_;
};

}  // namespace ferry::embed::service
