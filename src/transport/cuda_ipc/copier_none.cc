// Builds without CUDA: no GPU copies.
#include "transport/cuda_ipc/copier.h"

namespace ferry::internal::cuda_ipc {
Result<std::unique_ptr<Copier>> MakeCudaCopier(std::shared_ptr<cuda::CopyEngines> /*engines*/) {
  return Status(Code::kUnsupported, "ferry was built without CUDA");
}
}  // namespace ferry::internal::cuda_ipc
