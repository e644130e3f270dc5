// Probes that ferry's kernels can run on the current device. nvcc embeds machine code (SASS)
// for the architectures the build named and PTX for some; a device of another architecture
// (an A100 given a build for sm_90 only) cannot load them, and the first launch fails deep in
// a transfer. runtime.cc asks these once per device (KernelsLoad) and says why up front.
// The interface holds no CUDA type so that plain C++ files can include it.
#pragma once

namespace ferry::cuda {

// One probe per .cu file: cudaFuncGetAttributes on one of its kernels, on the current device.
// Returns the cudaError_t (0: its code loads; cudaErrorNoKernelImageForDevice or
// cudaErrorInvalidDeviceFunction: not built for this device).
int ProbeCopyKernels();
int ProbeUvaKernels();
int ProbeLayerHashKernels();

}  // namespace ferry::cuda
