// The UVA kernel's entry point in a build without CUDA: never reached (embed::UvaGatherer::Create
// fails first), present so that the library links.
#include "cuda/uva_kernels.h"

namespace ferry::cuda {

int LaunchUvaGather(const UvaStepArgs&, CUstream_st*) { return -1; }

}  // namespace ferry::cuda
