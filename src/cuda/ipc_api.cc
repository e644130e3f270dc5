#include "cuda/ipc_api.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/os.h"

namespace ferry::cuda {
namespace {

// Takes the descriptors `fds` of process `pid` into this one (pidfd_getfd: same user, and
// ptrace rights over that process where Yama restricts them).
Result<std::vector<int>> TakeDescriptors(int pid, const std::vector<VmmPiece>& pieces) {
  os::Env* env = os::Env::Current();
  const int pidfd = env->PidfdOpen(pid, 0);
  if (pidfd < 0) return os::ErrnoStatus(Code::kUnavailable, "pidfd_open(" + std::to_string(pid) + ")", errno);
  std::vector<int> fds;
  for (const auto& p : pieces) {
    const int fd = env->PidfdGetfd(pidfd, p.fd, 0);
    if (fd < 0) {
      const int e = errno;
      for (int x : fds) (void)env->Close(x);
      (void)env->Close(pidfd);
      return os::ErrnoStatus(e == EPERM ? Code::kPermissionDenied : Code::kUnavailable,
                             "pidfd_getfd of the peer's allocation", e);
    }
    fds.push_back(fd);
  }
  (void)env->Close(pidfd);
  return fds;
}

class RuntimeIpcApi final : public IpcApi {
 public:
  Result<VmmExport> ExportVmm(const void* ptr, uint64_t bytes) override { return VmmExportRange(ptr, bytes); }
  Result<void*> OpenVmm(int pid, const std::vector<VmmPiece>& pieces, int device) override {
    FERRY_ASSIGN_OR_RETURN(std::vector<int> fds, TakeDescriptors(pid, pieces));
    std::vector<VmmPiece> mine = pieces;
    for (size_t i = 0; i < fds.size(); ++i) mine[i].fd = fds[i];
    auto mapped = VmmMapPieces(mine, device);
    for (int fd : fds) (void)os::Env::Current()->Close(fd);
    return mapped;
  }
  Status CloseVmm(void* mapped_base, uint64_t size) override { return VmmUnmap(mapped_base, size); }
  Result<AllocationRange> GetAllocationRange(const void* ptr) override { return cuda::GetAllocationRange(ptr); }
  Result<IpcHandle> GetHandle(void* allocation_base) override { return IpcGetHandle(allocation_base); }
  Result<void*> OpenHandle(const IpcHandle& handle, int device) override { return IpcOpenHandle(handle, device); }
  Status CloseHandle(void* mapped_base) override { return IpcCloseHandle(mapped_base); }
};

}  // namespace

Result<VmmExport> IpcApi::ExportVmm(const void*, uint64_t) {
  return Status(Code::kUnsupported, "this IPC api does not export VMM memory");
}
Result<void*> IpcApi::OpenVmm(int, const std::vector<VmmPiece>&, int) {
  return Status(Code::kUnsupported, "this IPC api does not map VMM memory");
}
Status IpcApi::CloseVmm(void*, uint64_t) { return Status(Code::kUnsupported, "this IPC api does not map VMM memory"); }

IpcApi& IpcApi::Default() {
  static IpcApi* api = new RuntimeIpcApi();  // never destroyed: transports may outlive statics
  return *api;
}

}  // namespace ferry::cuda
