// The kernels' entry points in a build without CUDA: never reached (embed::UvaGatherer::Create
// and gpu::Stream::Create fail first), present so that the library links; they report
// kLaunchUnsupported, which gpu::Stream::Spin turns into kUnsupported.
#include "cuda/uva_kernels.h"

namespace ferry::cuda {

int LaunchUvaGather(const UvaStepArgs&, CUstream_st*) { return kLaunchUnsupported; }
int LaunchSpin(uint64_t, CUstream_st*) { return kLaunchUnsupported; }

}  // namespace ferry::cuda
