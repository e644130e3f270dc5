// The CUDA seam of a build without the CUDA toolkit: CUDA is never available.
#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {
Status NoCuda() { return Status(Code::kUnsupported, "ferry was built without CUDA"); }
}  // namespace

bool Built() { return false; }
bool Available() { return false; }
std::string UnavailableReason() { return "ferry was built without CUDA"; }
int DeviceCount() { return 0; }
std::vector<DeviceInfo> Devices() { return {}; }
std::string BuiltArchitectures() { return ""; }
Status KernelsLoad(int) { return NoCuda(); }
Status HostRegister(void*, size_t) { return NoCuda(); }
Status HostRegisterReadOnly(void*, size_t) { return NoCuda(); }
Status HostUnregister(void*) { return NoCuda(); }
Result<PointerInfo> QueryPointer(const void*) { return PointerInfo{}; }
Result<void*> Malloc(int, size_t) { return NoCuda(); }
Status Free(void*) { return NoCuda(); }
Status CopySync(void*, const void*, size_t) { return NoCuda(); }
Status MemsetSync(void*, int, size_t) { return NoCuda(); }
Result<AllocationRange> GetAllocationRange(const void*) { return NoCuda(); }
Result<IpcHandle> IpcGetHandle(void*) { return NoCuda(); }
Result<void*> IpcOpenHandle(const IpcHandle&, int) { return NoCuda(); }
Status IpcCloseHandle(void*) { return NoCuda(); }
Result<VmmExport> VmmExportRange(const void*, uint64_t) { return NoCuda(); }
Result<void*> VmmMapPieces(const std::vector<VmmPiece>&, int) { return NoCuda(); }
Status VmmUnmap(void*, uint64_t) { return NoCuda(); }
Result<void*> VmmAlloc(int, uint64_t, int) { return NoCuda(); }
Status VmmFree(void*) { return NoCuda(); }

}  // namespace ferry::cuda
