// The local transport's CUDA path: each batch goes to the engine's CopyEngine of the device
// that reads the data (the source's device, or the device side of a host<->device copy), so
// that copies across GPUs push over NVLink. The TransferState's poller polls that engine; the
// engine's completer thread completes batches nobody polls.
#include <mutex>
#include <vector>

#include "cuda/copy_engine.h"
#include "cuda/nvtx.h"
#include "cuda/runtime.h"
#include "transport/cuda_op_space.h"
#include "transport/local/cuda_path.h"

namespace ferry::internal {
namespace {

class CudaPathImpl final : public CudaPath {
 public:
  explicit CudaPathImpl(std::shared_ptr<cuda::CopyEngines> engines) : engines_(std::move(engines)) {}

  Status Post(Op op, const Region& local, const Region& remote, std::span<const TransferOp> ops,
              uint64_t total_bytes, const std::shared_ptr<TransferState>& state,
              const cuda::OpBuffer* buffer) override {
    cuda::NvtxRange range("ferry local cuda copy");
    const bool write = op == Op::kWrite;
    const Region& src = write ? local : remote;
    const Region& dst = write ? remote : local;
    const int device = CopyingDevice(src, dst);
    FERRY_ASSIGN_OR_RETURN(cuda::CopyEngine * engine, engines_->For(device));

    // The engine reads the ops in place: no per-piece array is built before the GPU starts.
    cuda::OffsetBatch batch{ops, dst.base, src.base, write, buffer};
    if (total_bytes == 0) return Status::Ok();

    cuda::PostOptions options;
    const bool src_reached = KernelReaches(src, device), dst_reached = KernelReaches(dst, device);
    options.kernel_ok = src_reached && dst_reached;
    options.pageable = (src.kind == MemoryKind::kHost && !src_reached) ||
                       (dst.kind == MemoryKind::kHost && !dst_reached);
    options.large_to_dma = !(src.kind == MemoryKind::kCuda && dst.kind == MemoryKind::kCuda && src.device == dst.device);
    // Page-locked host memory on one side, this device's memory on the other: runs of pieces
    // that lie end to end on the host go through device staging and one DMA copy a chunk.
    if (options.kernel_ok && src.kind == MemoryKind::kCuda && src.device == device && dst.kind == MemoryKind::kHost)
      options.host_side = cuda::PostOptions::HostSide::kDst;
    if (options.kernel_ok && dst.kind == MemoryKind::kCuda && dst.device == device && src.kind == MemoryKind::kHost)
      options.host_side = cuda::PostOptions::HostSide::kSrc;
    options.deadline = state->deadline();
    options.on_done = [state](const Status& s) { state->PartDone(s); };
    // The poster's own part keeps the transfer open until Post returns, so the poller and the
    // part are in place before the GPU part can complete.
    state->SetPoller(engine->Poller());
    state->AddParts(1);
    auto posted = engine->Post(batch, std::move(options));
    if (!posted.ok()) {
      state->PartDone(posted.status());
      return posted.status();
    }
    return Status::Ok();
  }

  std::unique_ptr<OpSpace> ReserveOps(Op op, const Region& local, const Region& remote, size_t n) override {
    if (local.kind != MemoryKind::kCuda || remote.kind != MemoryKind::kCuda) return nullptr;
    const bool write = op == Op::kWrite;
    auto engine = engines_->For(CopyingDevice(write ? local : remote, write ? remote : local));
    if (!engine.ok()) return nullptr;
    return MakeCudaOpSpace((*engine)->ReserveOps(n));
  }

 private:
  // The device whose engine copies: the source's, or the device side of a host<->device copy.
  static int CopyingDevice(const Region& src, const Region& dst) {
    return src.kind == MemoryKind::kCuda ? src.device : dst.device;
  }

  // Whether a kernel on `device` can address `r`: its own memory, a peer's with peer access
  // on, or page-locked host memory mapped into the device's address space. Pageable host
  // memory only the DMA engines reach.
  static bool KernelReaches(const Region& r, int device) {
    if (r.kind == MemoryKind::kCuda) return r.device == device || cuda::EnablePeerAccess(device, r.device).ok();
    return cuda::IsMappedHost(r.base, device);
  }

  const std::shared_ptr<cuda::CopyEngines> engines_;
};

}  // namespace

Result<std::unique_ptr<CudaPath>> CudaPath::Create(std::shared_ptr<cuda::CopyEngines> engines) {
  if (!cuda::Available()) return Status(Code::kUnsupported, "no CUDA device: " + cuda::UnavailableReason());
  if (!engines) engines = std::make_shared<cuda::CopyEngines>();
  return std::unique_ptr<CudaPath>(new CudaPathImpl(std::move(engines)));
}

}  // namespace ferry::internal
