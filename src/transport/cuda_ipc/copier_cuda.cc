// The CUDA copier: the engine's cuda::CopyEngine of each device, made on first use.
#include <memory>

#include "cuda/nvtx.h"
#include "cuda/runtime.h"
#include "transport/cuda_ipc/copier.h"

namespace ferry::internal::cuda_ipc {
namespace {

class CudaCopier final : public Copier {
 public:
  explicit CudaCopier(std::shared_ptr<cuda::CopyEngines> engines) : engines_(std::move(engines)) {}

  Status Post(int device, const cuda::OffsetBatch& batch, bool kernel_ok, bool same_device, Deadline deadline,
              std::function<void(const Status&)> on_done) override {
    cuda::NvtxRange range("ferry cuda_ipc copy");
    FERRY_ASSIGN_OR_RETURN(cuda::CopyEngine * engine, engines_->For(device));
    cuda::PostOptions options;
    options.kernel_ok = kernel_ok;
    options.large_to_dma = !same_device;
    options.deadline = deadline;
    options.on_done = std::move(on_done);
    auto posted = engine->Post(batch, std::move(options));
    return posted.ok() ? Status::Ok() : posted.status();
  }

  std::optional<cuda::OpBuffer> ReserveOps(int device, size_t n) override {
    auto engine = engines_->For(device);
    return engine.ok() ? (*engine)->ReserveOps(n) : std::nullopt;
  }

  std::function<void()> Poller(int device) override {
    auto engine = engines_->For(device);
    return engine.ok() ? (*engine)->Poller() : std::function<void()>();
  }

  bool KernelReaches(int device, const void* ptr) override {
    // Device memory of this device, or of a peer device with peer access on (an IPC mapping
    // of an allocation on another GPU).
    auto info = cuda::QueryPointer(ptr);
    if (!info.ok() || !info->device_memory) return false;
    return info->device == device || cuda::EnablePeerAccess(device, info->device).ok();
  }

  bool OnDevice(int device, const void* ptr) override {
    auto info = cuda::QueryPointer(ptr);
    return info.ok() && info->device_memory && info->device == device;
  }

 private:
  const std::shared_ptr<cuda::CopyEngines> engines_;
};

}  // namespace

Result<std::unique_ptr<Copier>> MakeCudaCopier(std::shared_ptr<cuda::CopyEngines> engines) {
  if (!cuda::Available()) return Status(Code::kUnsupported, "no CUDA device: " + cuda::UnavailableReason());
  if (!engines) engines = std::make_shared<cuda::CopyEngines>();
  return std::unique_ptr<Copier>(new CudaCopier(std::move(engines)));
}

}  // namespace ferry::internal::cuda_ipc
