// Can GPU memory made with cuMem (the VMM API: PyTorch's expandable segments, vLLM's and
// SGLang's sleep-mode allocators) go to another process, as cuda_ipc does for cudaMalloc memory?
// A probe, not part of the build. The parent maps two physical allocations (POSIX file
// descriptor handles) into one range, checks what cudaIpcGetMemHandle and the range queries
// say of it, exports a descriptor per allocation, and starts itself as a child, which takes
// the descriptors with pidfd_getfd, maps them into a range of its own and checks every byte.
//   nvcc -O2 -std=c++17 -o /tmp/vmm_share_probe bench/vmm_share_probe.cu -lcuda && /tmp/vmm_share_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CU(x)                                                            \
  do {                                                                   \
    CUresult r_ = (x);                                                   \
    if (r_ != CUDA_SUCCESS) {                                            \
      const char* s_ = nullptr;                                          \
      cuGetErrorString(r_, &s_);                                         \
      std::printf("%s: %s\n", #x, s_ ? s_ : "?");                        \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

__global__ void Fill(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<unsigned>(i * 2654435761u) ^ seed;
}

CUmemAllocationProp Prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves `chunks` x `chunk` bytes and maps the given handles there, readable and writable
// from `device`.
CUdeviceptr MapRange(const std::vector<CUmemGenericAllocationHandle>& handles, size_t chunk, int device) {
  CUdeviceptr va = 0;
  CU(cuMemAddressReserve(&va, handles.size() * chunk, 0, 0, 0));
  for (size_t i = 0; i < handles.size(); ++i) CU(cuMemMap(va + i * chunk, chunk, 0, handles[i], 0));
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemSetAccess(va, handles.size() * chunk, &access, 1));
  return va;
}

// Makes device 0's primary context current (the runtime's, too).
CUdevice UseDevice0() {
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  return dev;
}

bool Check(CUdeviceptr va, size_t bytes, unsigned seed) {
  std::vector<unsigned> host(bytes / 4);
  CU(cuMemcpyDtoH(host.data(), va, bytes));
  for (size_t i = 0; i < host.size(); ++i)
    if (host[i] != (static_cast<unsigned>(i * 2654435761u) ^ seed)) {
      std::printf("  word %zu differs\n", i);
      return false;
    }
  return true;
}

int Child(int argc, char** argv) {
  const pid_t parent = static_cast<pid_t>(std::atoi(argv[2]));
  const size_t chunk = std::strtoull(argv[3], nullptr, 10);
  std::vector<int> remote_fds;
  for (int i = 4; i < argc; ++i) remote_fds.push_back(std::atoi(argv[i]));
  const CUdevice dev = UseDevice0();
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, parent, 0));
  if (pidfd < 0) {
    std::printf("child: pidfd_open: %s\n", std::strerror(errno));
    return 1;
  }
  std::vector<CUmemGenericAllocationHandle> handles;
  for (int rfd : remote_fds) {
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, rfd, 0));
    if (fd < 0) {
      std::printf("child: pidfd_getfd(%d): %s\n", rfd, std::strerror(errno));
      return 1;
    }
    CUmemGenericAllocationHandle h;
    CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    handles.push_back(h);
  }
  CUdeviceptr va = MapRange(handles, chunk, 0);
  for (auto h : handles) CU(cuMemRelease(h));  // the mapping keeps the memory
  const bool ok = Check(va, handles.size() * chunk, 0x5eed);
  std::printf("child: mapped %zu allocations at 0x%llx, bytes %s\n", handles.size(),
              static_cast<unsigned long long>(va), ok ? "verified" : "WRONG");
  // Writes through the mapping are seen by the parent.
  Fill<<<256, 256>>>(reinterpret_cast<unsigned*>(va), handles.size() * chunk / 4, 0xc0de);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  CU(cuMemUnmap(va, handles.size() * chunk));
  CU(cuMemAddressFree(va, handles.size() * chunk));
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "child") == 0) return Child(argc, argv);
  const CUdevice dev = UseDevice0();
  int vmm = 0, posix = 0;
  CU(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  CU(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  std::printf("VMM supported %d, POSIX fd handles %d\n", vmm, posix);
  CUmemAllocationProp prop = Prop(0);
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t chunk = 10 * gran;  // 20 MiB at 2 MiB granularity, as PyTorch's segments
  std::vector<CUmemGenericAllocationHandle> handles(2);
  for (auto& h : handles) CU(cuMemCreate(&h, chunk, &prop, 0));
  CUdeviceptr va = MapRange(handles, chunk, 0);
  const size_t bytes = handles.size() * chunk;
  Fill<<<256, 256>>>(reinterpret_cast<unsigned*>(va), bytes / 4, 0x5eed);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  std::printf("granularity %zu, chunk %zu, range 0x%llx + %zu\n", gran, chunk, static_cast<unsigned long long>(va), bytes);

  // What the runtime and driver say of such memory.
  cudaIpcMemHandle_t ipc;
  cudaError_t e = cudaIpcGetMemHandle(&ipc, reinterpret_cast<void*>(va));
  std::printf("cudaIpcGetMemHandle: %s\n", cudaGetErrorString(e));
  (void)cudaGetLastError();
  for (size_t off : {size_t(0), chunk - 1, chunk, chunk + 12345}) {
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = cuMemGetAddressRange(&base, &size, va + off);
    std::printf("cuMemGetAddressRange(+%zu): %d base +%lld size %zu\n", off, static_cast<int>(r),
                static_cast<long long>(base - va), size);
    CUmemGenericAllocationHandle h;
    r = cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(va + off));
    CUmemAllocationProp p = {};
    if (r == CUDA_SUCCESS) {
      CU(cuMemGetAllocationPropertiesFromHandle(&p, h));
      std::printf("  retained handle: same as chunk %d, requested handle types %d\n",
                  h == handles[0] ? 0 : h == handles[1] ? 1 : -1, static_cast<int>(p.requestedHandleTypes));
      CU(cuMemRelease(h));
    } else {
      std::printf("  cuMemRetainAllocationHandle: %d\n", static_cast<int>(r));
    }
  }
  cudaPointerAttributes attr = {};
  e = cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(va + chunk));
  std::printf("cudaPointerGetAttributes: %s type %d device %d\n", cudaGetErrorString(e), static_cast<int>(attr.type), attr.device);

  std::vector<int> fds;
  for (auto h : handles) {
    int fd = -1;
    CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fds.push_back(fd);
  }
  std::string cmd = std::string(argv[0]) + " child " + std::to_string(getpid()) + " " + std::to_string(chunk);
  for (int fd : fds) cmd += " " + std::to_string(fd);
  std::printf("running: %s\n", cmd.c_str());
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  const bool seen = Check(va, bytes, 0xc0de);
  std::printf("child exit %d; its writes %s in the parent\n", WEXITSTATUS(rc), seen ? "seen" : "NOT seen");
  for (int fd : fds) close(fd);
  CU(cuMemUnmap(va, bytes));
  CU(cuMemAddressFree(va, bytes));
  for (auto h : handles) CU(cuMemRelease(h));
  return rc == 0 && seen ? 0 : 1;
}
