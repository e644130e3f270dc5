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
  // VMM memory (runtime.h): exports the allocations behind a range; maps the allocations that
  // process `pid` exported (its descriptors, taken with pidfd_getfd) on `device`; unmaps such
  // a mapping. kUnsupported unless overridden.
  virtual Result<VmmExport> ExportVmm(const void* ptr, uint64_t bytes);
  virtual Result<void*> OpenVmm(int pid, const std::vector<VmmPiece>& pieces, int device);
  virtual Status CloseVmm(void* mapped_base, uint64_t size);

  // The process-wide implementation over the CUDA runtime; never destroyed.
  static IpcApi& Default();
};

}  // namespace ferry::cuda
