// The OpSpace of the CUDA paths (the local transport's CUDA path and cuda_ipc): one of a copy
// engine's op buffers, launched from as it lies (cuda::OpBuffer).
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "cuda/copy_engine.h"
#include "transport/transport.h"

namespace ferry::internal {

class CudaOpSpace final : public OpSpace {
 public:
  explicit CudaOpSpace(cuda::OpBuffer buffer) : buffer_(std::move(buffer)) {}
  TransferOp* data() override { return buffer_.ops; }
  void set_max_op_size(uint64_t bytes) override { buffer_.max_op_size = bytes; }
  const cuda::OpBuffer& buffer() const { return buffer_; }

 private:
  cuda::OpBuffer buffer_;
};

// A channel's ReserveOps: the buffer its copy engine gave, if any, as an OpSpace.
inline std::unique_ptr<OpSpace> MakeCudaOpSpace(std::optional<cuda::OpBuffer> buffer) {
  return buffer ? std::make_unique<CudaOpSpace>(std::move(*buffer)) : nullptr;
}

// A channel's PostReserved: the buffer inside a space that the same channel's ReserveOps made.
inline const cuda::OpBuffer* OpBufferOf(OpSpace& space) { return &static_cast<CudaOpSpace&>(space).buffer(); }

}  // namespace ferry::internal
