// The UVA kernel's entry points in a build without CUDA: never reached (UvaGatherer::Create
// fails first), present so that the library links.
#include "embed/uva_kernels.h"

namespace ferry::embed {

int LaunchUvaGather(const UvaStepArgs&, CUstream_st*) { return -1; }
int SynchronizeUvaStream(CUstream_st*) { return -1; }

}  // namespace ferry::embed
