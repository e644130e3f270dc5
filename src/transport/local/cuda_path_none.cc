// Builds without CUDA: the local transport carries host memory only.
#include "transport/local/cuda_path.h"

namespace ferry::internal {

Result<std::unique_ptr<CudaPath>> CudaPath::Create(std::shared_ptr<cuda::CopyEngines> /*engines*/) {
  return Status(Code::kUnsupported, "ferry was built without CUDA");
}

}  // namespace ferry::internal
