// The CUDA copier: the cuda::CopyEngine of each device, made on first use.
#include <mutex>
#include <vector>

#include "cuda/runtime.h"
#include "transport/cuda_ipc/copier.h"

namespace ferry::internal::cuda_ipc {
namespace {

class CudaCopier final : public Copier {
 public:

  Status Post(int device, const cuda::OffsetBatch& batch, bool kernel_ok, bool same_device, Deadline deadline,
              std::function<void(const Status&)> on_done) override {
    FERRY_ASSIGN_OR_RETURN(cuda::CopyEngine * engine, engines_.For(device));
    cuda::PostOptions options;
    options.kernel_ok = kernel_ok;
    options.large_to_dma = !same_device;
    options.deadline = deadline;
    options.on_done = std::move(on_done);
    auto posted = engine->Post(batch, std::move(options));
    return posted.ok() ? Status::Ok() : posted.status();
  }

  std::function<void()> Poller(int device) override {
    auto engine = engines_.For(device);
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
  cuda::CopyEngines engines_;

 public:
  cuda::CopyStats stats() override { return engines_.stats(); }
};

}  // namespace

Result<std::unique_ptr<Copier>> MakeCudaCopier() {
  if (!cuda::Available()) return Status(Code::kUnsupported, "no CUDA device: " + cuda::UnavailableReason());
  return std::unique_ptr<Copier>(new CudaCopier());
}

}  // namespace ferry::internal::cuda_ipc
