// Buffer: memory the CLI registers with an engine, host (page-aligned, pre-faulted; from the
// heap or shareable with peers of this host, see ferry/shared_memory.h) or CUDA device memory,
// freed when the Buffer goes away. Fill and check go through host memory, so
// CUDA buffers are staged through a host copy.
//
// Thread safety: none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ferry/descriptors.h"
#include "ferry/engine.h"
#include "ferry/shared_memory.h"
#include "ferry/status.h"

namespace ferry::tools {

// Where host buffers come from: the heap, or ferry::AllocateSharedHost (reached by `shm`).
enum class HostAlloc : uint8_t { kHeap, kShared };

class Buffer {
 public:
  // Host memory is zeroed (faulting every page in); device memory is zeroed with a memset.
  static Result<std::unique_ptr<Buffer>> Allocate(MemoryKind kind, int device, uint64_t bytes,
                                                  HostAlloc alloc = HostAlloc::kHeap);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }

  // Copies host bytes in at `offset`, or out of it. REQUIRES: the range lies inside the buffer.
  Status Write(uint64_t offset, std::span<const std::byte> from);
  Status Read(uint64_t offset, std::span<std::byte> to) const;

 private:
  Buffer(MemoryKind kind, int device, std::byte* data, uint64_t size)
      : kind_(kind), device_(device), data_(data), size_(size) {}

  MemoryKind kind_;
  int device_;
  std::byte* data_;
  uint64_t size_;
  HostBuffer shared_;  // owns data_ when the buffer is shareable host memory
};

// Deregisters `desc` from `engine` (waiting for transfers still using it), then frees `buffer`.
// When deregistration fails, e.g. a copy outlived its transfer's deadline and still runs, the
// buffer is leaked on purpose rather than freed under that copy, and a warning is printed.
void DeregisterAndFree(Engine& engine, const MemoryDesc& desc, std::unique_ptr<Buffer>& buffer);

// "host" -> kHost, "cuda" -> kCuda.
Result<MemoryKind> ParseMemoryKind(std::string_view name);
// "heap" -> kHeap, "shared" -> kShared.
Result<HostAlloc> ParseHostAlloc(std::string_view name);

}  // namespace ferry::tools
