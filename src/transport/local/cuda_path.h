// The local transport's path for batches that touch CUDA memory (host<->device,
// device<->device): copies run on a stream owned by the transport and complete through an
// event that Test()/Wait() poll; a batch of many small pieces is one kernel launch, not one
// call per piece.
#pragma once

#include <memory>
#include <span>

#include "cuda/copy_engine.h"  // cuda::CopyStats (no CUDA header)
#include "ferry/types.h"
#include "transport/region.h"
#include "transport/transfer_state.h"

namespace ferry::internal {

class CudaPath {
 public:
  // kUnsupported when this build has no CUDA or no device is present.
  static Result<std::unique_ptr<CudaPath>> Create();
  virtual ~CudaPath() = default;
  // What its copy engines enqueued so far.
  virtual cuda::CopyStats stats() { return {}; }
  // Moves validated `ops` between `local` and `remote` (at least one of them CUDA memory).
  virtual Status Post(Op op, const Region& local, const Region& remote,
                      std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state) = 0;
};

}  // namespace ferry::internal
