// The CUDA copier: one cuda::CopyEngine per device, made on first use.
#include <mutex>
#include <vector>

#include "cuda/runtime.h"
#include "transport/cuda_ipc/copier.h"

namespace ferry::internal::cuda_ipc {
namespace {

class CudaCopier final : public Copier {
 public:
  explicit CudaCopier(int devices) : engines_(devices) {}

  Status Post(int device, std::span<const cuda::Copy> copies, bool kernel_ok, Deadline deadline,
              std::function<void(const Status&)> on_done) override {
    FERRY_ASSIGN_OR_RETURN(cuda::CopyEngine * engine, EngineFor(device));
    cuda::PostOptions options;
    options.kernel_ok = kernel_ok;
    options.deadline = deadline;
    options.on_done = std::move(on_done);
    auto posted = engine->Post(copies, std::move(options));
    return posted.ok() ? Status::Ok() : posted.status();
  }

  std::function<void()> Poller(int device) override {
    auto engine = EngineFor(device);
    return engine.ok() ? (*engine)->Poller() : std::function<void()>();
  }

  bool KernelReaches(int device, const void* ptr) override {
    // Device memory of this device, or of a peer device with peer access on (an IPC mapping
    // of an allocation on another GPU).
    auto info = cuda::QueryPointer(ptr);
    if (!info.ok() || !info->device_memory) return false;
    return info->device == device || cuda::EnablePeerAccess(device, info->device).ok();
  }

 private:
  Result<cuda::CopyEngine*> EngineFor(int device) {
    if (device < 0 || device >= static_cast<int>(engines_.size()))
      return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device));
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = engines_[device];
    if (!slot) {
      FERRY_ASSIGN_OR_RETURN(slot, cuda::CopyEngine::Create(device));
    }
    return slot.get();
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<cuda::CopyEngine>> engines_;  // GUARDED_BY(mu_); by ordinal
};

}  // namespace

Result<std::unique_ptr<Copier>> MakeCudaCopier() {
  if (!cuda::Available()) return Status(Code::kUnsupported, "no CUDA device: " + cuda::UnavailableReason());
  return std::unique_ptr<Copier>(new CudaCopier(cuda::DeviceCount()));
}

}  // namespace ferry::internal::cuda_ipc
