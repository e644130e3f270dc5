#include "cuda/ipc_api.h"

namespace ferry::cuda {
namespace {

class RuntimeIpcApi final : public IpcApi {
 public:
  Result<AllocationRange> GetAllocationRange(const void* ptr) override { return cuda::GetAllocationRange(ptr); }
  Result<IpcHandle> GetHandle(void* allocation_base) override { return IpcGetHandle(allocation_base); }
  Result<void*> OpenHandle(const IpcHandle& handle, int device) override { return IpcOpenHandle(handle, device); }
  Status CloseHandle(void* mapped_base) override { return IpcCloseHandle(mapped_base); }
};

}  // namespace

IpcApi& IpcApi::Default() {
  static IpcApi* api = new RuntimeIpcApi();  // never destroyed: transports may outlive statics
  return *api;
}

}  // namespace ferry::cuda
