#include "buffers.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "ferry/gpu.h"
#include "ferry/system.h"
#include "units.h"

namespace ferry::tools {
namespace {
constexpr uint64_t kPage = 4096;
}  // namespace

Result<std::unique_ptr<Buffer>> Buffer::Allocate(MemoryKind kind, int device, uint64_t bytes,
                                                 HostAlloc alloc) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "cannot allocate an empty buffer");
  if (kind == MemoryKind::kHost && alloc == HostAlloc::kShared) {
    FERRY_ASSIGN_OR_RETURN(HostBuffer shared, AllocateSharedHost(bytes));  // zeroed, faulted in
    std::unique_ptr<Buffer> buffer(new Buffer(kind, -1, shared.data(), bytes));
    buffer->shared_ = std::move(shared);
    return buffer;
  }
  if (kind == MemoryKind::kHost) {
    uint64_t rounded = (bytes + kPage - 1) / kPage * kPage;
    void* p = std::aligned_alloc(kPage, rounded);
    if (p == nullptr)
      return Status(Code::kResourceExhausted,
                    fmt::format("cannot allocate {} bytes of host memory", bytes));
    std::memset(p, 0, rounded);
    return std::unique_ptr<Buffer>(new Buffer(kind, -1, static_cast<std::byte*>(p), bytes));
  }
  std::string reason;
  if (!CudaAvailable(&reason)) return Status(Code::kUnsupported, "CUDA memory: " + reason);
  FERRY_ASSIGN_OR_RETURN(void* p, gpu::DeviceAlloc(device, bytes));
  std::unique_ptr<Buffer> buffer(new Buffer(kind, device, static_cast<std::byte*>(p), bytes));
  FERRY_RETURN_IF_ERROR(gpu::MemsetSync(p, 0, bytes));
  return buffer;
}

Buffer::~Buffer() {
  if (shared_) return;  // shared_ unmaps it
  if (kind_ == MemoryKind::kHost) {
    std::free(data_);
  } else {
    (void)gpu::DeviceFree(data_);  // nothing to do about a failure while tearing down
  }
}

Status Buffer::Write(uint64_t offset, std::span<const std::byte> from) {
  if (kind_ == MemoryKind::kHost) {
    std::memcpy(data_ + offset, from.data(), from.size());
    return Status::Ok();
  }
  return gpu::CopySync(data_ + offset, from.data(), from.size());
}

Status Buffer::Read(uint64_t offset, std::span<std::byte> to) const {
  if (kind_ == MemoryKind::kHost) {
    std::memcpy(to.data(), data_ + offset, to.size());
    return Status::Ok();
  }
  return gpu::CopySync(to.data(), data_ + offset, to.size());
}

void DeregisterAndFree(Engine& engine, const MemoryDesc& desc, std::unique_ptr<Buffer>& buffer) {
  Status s = engine.DeregisterMemory(desc);
  if (!s.ok()) {
    fmt::print(stderr, "ferry: keeping {} of memory allocated: {}\n", FormatBytes(desc.size),
               s.ToString());
    (void)buffer.release();
    return;
  }
  buffer.reset();
}

Result<MemoryKind> ParseMemoryKind(std::string_view name) {
  if (name == "host") return MemoryKind::kHost;
  if (name == "cuda") return MemoryKind::kCuda;
  return Status(Code::kInvalidArgument,
                fmt::format("unknown memory kind '{}' (host or cuda)", name));
}

Result<HostAlloc> ParseHostAlloc(std::string_view name) {
  if (name == "heap") return HostAlloc::kHeap;
  if (name == "shared") return HostAlloc::kShared;
  return Status(Code::kInvalidArgument,
                fmt::format("unknown host allocation '{}' (heap or shared)", name));
}

}  // namespace ferry::tools
