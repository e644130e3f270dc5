// The local transport's path for batches that touch CUDA memory (host<->device,
// device<->device): copies run on the engine's copy engines (TransportContext::copy_engines,
// shared with its other transports) and complete through an event that Test()/Wait() poll; a
// batch of many small pieces is one kernel launch, not one call per piece.
//
// Thread safety: Post may be called from any thread.
#pragma once

#include <memory>
#include <span>

#include "cuda/copy_engine.h"  // cuda::CopyEngines (no CUDA header)
#include "ferry/types.h"
#include "transport/region.h"
#include "transport/transfer_state.h"
#include "transport/transport.h"  // OpSpace

namespace ferry::internal {

class CudaPath {
 public:
  // Copies on `engines` (a set of its own when null). kUnsupported when this build has no CUDA
  // or no device is present.
  static Result<std::unique_ptr<CudaPath>> Create(std::shared_ptr<cuda::CopyEngines> engines);
  virtual ~CudaPath() = default;
  // Moves validated `ops` between `local` and `remote` (at least one of them CUDA memory).
  // `buffer`: the op buffer `ops` lie in (from ReserveOps), or null.
  virtual Status Post(Op op, const Region& local, const Region& remote,
                      std::span<const TransferOp> ops, uint64_t total_bytes,
                      const std::shared_ptr<TransferState>& state, const cuda::OpBuffer* buffer) = 0;
  // An op buffer of the copy engine that would move a batch of `n` ops between GPU regions
  // `local` and `remote`; null when either is host memory or the engine has none free.
  virtual std::unique_ptr<OpSpace> ReserveOps(Op op, const Region& local, const Region& remote, size_t n) = 0;
};

}  // namespace ferry::internal
