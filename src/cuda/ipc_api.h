// IpcApi: the CUDA IPC calls of runtime.h behind an interface, so that the cuda_ipc transport
// can be driven by a fake on a machine without a GPU (to make cudaIpcOpenMemHandle fail on
// purpose, or to map "device" memory that is really host memory in a protocol test).
// Default() forwards to the runtime.h functions (kUnsupported / kFailedPrecondition where CUDA
// is missing).
//
// Thread safety: implementations must be callable from any thread.
#pragma once

#include "cuda/runtime.h"

namespace ferry::cuda {

class IpcApi {
 public:
  virtual ~IpcApi() = default;
  virtual Result<AllocationRange> GetAllocationRange(const void* ptr) = 0;
  virtual Result<IpcHandle> GetHandle(void* allocation_base) = 0;
  virtual Result<void*> OpenHandle(const IpcHandle& handle, int device) = 0;
  virtual Status CloseHandle(void* mapped_base) = 0;

  // The process-wide implementation over the CUDA runtime; never destroyed.
  static IpcApi& Default();
};

}  // namespace ferry::cuda
