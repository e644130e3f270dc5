// Copier: how the cuda_ipc transport moves a batch, behind an interface so that protocol tests
// run without a GPU. The CUDA copier (copier_cuda.cc) hands each batch to the engine's
// cuda::CopyEngine of the local region's device (TransportContext::copy_engines, shared with
// the engine's other transports): one kernel launch for the small pieces, the DMA engines for
// large ones, completion observed by polling the engine's events. Builds without CUDA have no
// CUDA copier (MakeCudaCopier() is kUnsupported).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "cuda/copy_engine.h"  // cuda::OffsetBatch, cuda::CopyEngines (no CUDA header)
#include "ferry/status.h"

namespace ferry::internal::cuda_ipc {

class Copier {
 public:
  virtual ~Copier() = default;
  // Enqueues the copies of `batch` (its ops are read during the call only) on `device`;
  // `on_done` runs once when all are complete (or failed). `kernel_ok`: kernels on `device`
  // address every source and destination (KernelReaches). Returns an error, without calling
  // on_done, when nothing was enqueued.
  // `same_device`: both sides are `device`'s own memory (large pieces then stay in the kernel,
  // cuda::PostOptions::large_to_dma).
  virtual Status Post(int device, const cuda::OffsetBatch& batch, bool kernel_ok, bool same_device,
                      Deadline deadline, std::function<void(const Status&)> on_done) = 0;
  // An op buffer of `device`'s copy engine for a batch of `n` ops (cuda::CopyEngine::ReserveOps),
  // posted as OffsetBatch::buffer; none by default.
  virtual std::optional<cuda::OpBuffer> ReserveOps(int /*device*/, size_t /*n*/) { return std::nullopt; }
  // Drives completion of `device`'s batches (for TransferState::SetPoller); may be empty.
  virtual std::function<void()> Poller(int device) = 0;
  // Whether kernels on `device` can address memory mapped at `ptr` (the mapped IPC allocation
  // of a peer), so that small pieces may go to one kernel launch.
  virtual bool KernelReaches(int device, const void* ptr) = 0;
  // Whether memory mapped at `ptr` is `device`'s own (a peer process's allocation on the same GPU).
  virtual bool OnDevice(int /*device*/, const void* /*ptr*/) { return false; }
};

// A copier on `engines` (a set of its own when null); kUnsupported without CUDA or without a
// device.
Result<std::unique_ptr<Copier>> MakeCudaCopier(std::shared_ptr<cuda::CopyEngines> engines);

}  // namespace ferry::internal::cuda_ipc
