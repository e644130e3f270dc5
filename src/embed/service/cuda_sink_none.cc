// OpenCudaSink in a build without CUDA.
#include "embed/service/cuda_sink.h"

namespace ferry::embed::service {

Result<std::unique_ptr<OutputSink>> OpenCudaSink(const Register&, uint64_t) {
  return Status(Code::kUnsupported, "CUDA outputs need a build of ferry with CUDA");
}

}  // namespace ferry::embed::service
