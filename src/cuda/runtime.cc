// The CUDA seam of a build with the CUDA toolkit: calls go to the CUDA runtime (linked
// statically), which loads the driver at run time. With no driver or no device the probe fails
// once, is cached, and every call reports why instead of failing later in a worse place.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <type_traits>

#include "base/mutex.h"
#include "base/os.h"
#include "cuda/cuda_status.h"
#include "cuda/kernel_check.h"
#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {

struct Probe {
  std::string reason;  // empty when a device is usable
  std::vector<DeviceInfo> devices;
};

const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    int count = 0;
    cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
      p.reason = std::string(ToStatus(error, "no usable CUDA driver or device").message());
      return p;
    }
    if (count <= 0) {
      p.reason = "the CUDA driver reports no device";
      return p;
    }
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      Status s = ToStatus(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
      if (!s.ok()) {
        p.reason = "device " + std::to_string(d) + ": " + std::string(s.message());
        p.devices.clear();
        return p;
      }
      p.devices.push_back(DeviceInfo{d, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
    }
    return p;
  }();
  return probe;
}

Status NotAvailable() { return Status(Code::kFailedPrecondition, "CUDA is not available: " + GetProbe().reason); }

}  // namespace

bool Built() { return true; }
bool Available() { return GetProbe().reason.empty(); }
std::string UnavailableReason() { return GetProbe().reason; }
int DeviceCount() { return static_cast<int>(GetProbe().devices.size()); }
std::vector<DeviceInfo> Devices() { return GetProbe().devices; }

std::string BuiltArchitectures() { return FERRY_CUDA_ARCHS; }

namespace {
// Runs every .cu file's probe on `device`; the first that cannot load decides.
Status ProbeKernels(int device) {
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  for (int (*probe)() : {ProbeCopyKernels, ProbeUvaKernels, ProbeLayerHashKernels}) {
    const auto error = static_cast<cudaError_t>(probe());
    if (error == cudaSuccess) continue;
    // No SASS for this architecture and no PTX it can compile (or PTX newer than the driver).
    if (error == cudaErrorNoKernelImageForDevice || error == cudaErrorInvalidDeviceFunction ||
        error == cudaErrorUnsupportedPtxVersion || error == cudaErrorInvalidPtx) {
      (void)cudaGetLastError();  // the probe's error is reported here, not by a later call
      return Status(Code::kUnsupported, KernelsUnsupportedMessage(GetProbe().devices[device], FERRY_CUDA_ARCHS,
                                                                  cudaGetErrorString(error)));
    }
    return ToStatus(error, "cudaFuncGetAttributes (loading ferry's kernels on device " + std::to_string(device) + ")");
  }
  return Status();
}
}  // namespace

Status KernelsLoad(int device) {
  if (!Available()) return NotAvailable();
  if (device < 0 || device >= DeviceCount())
    return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device));
  static Mutex mu;
  static std::map<int, Status> probed;  // GUARDED_BY(mu): a device's answer does not change
  MutexLock lock(&mu);
  auto it = probed.find(device);
  if (it == probed.end()) it = probed.emplace(device, ProbeKernels(device)).first;
  return it->second;
}

Status HostRegister(void* ptr, size_t bytes) {
  if (!Available()) return NotAvailable();
  if (ptr == nullptr || bytes == 0) return Status(Code::kInvalidArgument, "cannot page-lock a null or empty range");
  // Portable: every device reaches it; mapped: kernels address it with the host pointer (UVA).
  return ToStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                  "cudaHostRegister");
}

Status HostRegisterReadOnly(void* ptr, size_t bytes) {
  if (!Available()) return NotAvailable();
  if (ptr == nullptr || bytes == 0) return Status(Code::kInvalidArgument, "cannot page-lock a null or empty range");
  return ToStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped |
                                                   cudaHostRegisterReadOnly),
                  "cudaHostRegister(read-only)");
}

Status HostUnregister(void* ptr) {
  if (!Available()) return NotAvailable();
  return ToStatus(cudaHostUnregister(ptr), "cudaHostUnregister");
}

Result<PointerInfo> QueryPointer(const void* ptr) {
  PointerInfo info;
  if (!Available() || ptr == nullptr) return info;
  cudaPointerAttributes attr{};
  FERRY_RETURN_IF_ERROR(ToStatus(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes"));
  if (attr.type == cudaMemoryTypeDevice) {
    info.device_memory = true;
    info.device = attr.device;
  }
  return info;
}

Result<void*> Malloc(int device, size_t bytes) {
  if (!Available()) return NotAvailable();
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  void* ptr = nullptr;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"));
  return ptr;
}

Status Free(void* ptr) {
  if (!Available()) return NotAvailable();
  return ToStatus(cudaFree(ptr), "cudaFree");
}

Status CopySync(void* dst, const void* src, size_t bytes) {
  if (!Available()) return NotAvailable();
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy"));
  // Device-to-device cudaMemcpy returns before the copy ends: wait for it.
  return ToStatus(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

Status MemsetSync(void* ptr, int value, size_t bytes) {
  if (!Available()) return NotAvailable();
  FERRY_ASSIGN_OR_RETURN(PointerInfo info, QueryPointer(ptr));
  if (!info.device_memory) return Status(Code::kInvalidArgument, "MemsetSync takes device memory");
  DeviceGuard guard(info.device);
  FERRY_RETURN_IF_ERROR(guard.status());
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMemset(ptr, value, bytes), "cudaMemset"));
  return ToStatus(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

// CUDA IPC.

namespace {
// cuMemGetAddressRange, looked up once through the runtime (the driver is loaded at run time).
PFN_cuMemGetAddressRange_v3020 AddressRangeFn() {
  static const PFN_cuMemGetAddressRange_v3020 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(f);
  }();
  return fn;
}
}  // namespace

Result<AllocationRange> GetAllocationRange(const void* ptr) {
  if (!Available()) return NotAvailable();
  FERRY_ASSIGN_OR_RETURN(PointerInfo info, QueryPointer(ptr));
  if (!info.device_memory) return Status(Code::kInvalidArgument, "pointer is not CUDA device memory");
  auto fn = AddressRangeFn();
  if (fn == nullptr) return Status(Code::kUnsupported, "the CUDA driver has no cuMemGetAddressRange");
  DeviceGuard guard(info.device);
  FERRY_RETURN_IF_ERROR(guard.status());
  // The driver call needs the device's primary context current on this thread; the guard
  // skips cudaSetDevice when the device is current already, which does not bind it.
  FERRY_RETURN_IF_ERROR(ToStatus(cudaSetDevice(info.device), "cudaSetDevice"));
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = fn(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS)
    return Status(Code::kInvalidArgument, "cuMemGetAddressRange failed with CUresult " + std::to_string(r));
  return AllocationRange{reinterpret_cast<void*>(base), size};
}

Result<IpcHandle> IpcGetHandle(void* allocation_base) {
  if (!Available()) return NotAvailable();
  cudaIpcMemHandle_t h{};
  FERRY_RETURN_IF_ERROR(ToStatus(cudaIpcGetMemHandle(&h, allocation_base), "cudaIpcGetMemHandle"));
  static_assert(sizeof(h) == kIpcHandleBytes);
  IpcHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<void*> IpcOpenHandle(const IpcHandle& handle, int device) {
  if (!Available()) return NotAvailable();
  DeviceGuard guard(device);  // the mapping is made in the current device's context
  FERRY_RETURN_IF_ERROR(guard.status());
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  void* ptr = nullptr;
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"));
  return ptr;
}

Status IpcCloseHandle(void* mapped_base) {
  if (!Available()) return NotAvailable();
  // Unmapped in the context it was mapped into.
  auto info = QueryPointer(mapped_base);
  DeviceGuard guard(info.ok() && info->device >= 0 ? info->device : 0);
  FERRY_RETURN_IF_ERROR(guard.status());
  return ToStatus(cudaIpcCloseMemHandle(mapped_base), "cudaIpcCloseMemHandle");
}

// VMM memory.

namespace {

// The driver's VMM calls, looked up once through the runtime (as cuMemGetAddressRange).
struct VmmFns {
  PFN_cuMemGetAddressRange_v3020 range = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 props = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_fd = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_fd = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 access = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  bool ok = false;
};

const VmmFns& Vmm() {
  static const VmmFns fns = [] {
    VmmFns f;
    auto get = [](const char* name, auto* out) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(p);
      return true;
    };
    f.ok = get("cuMemGetAddressRange", &f.range) && get("cuMemRetainAllocationHandle", &f.retain) &&
           get("cuMemGetAllocationPropertiesFromHandle", &f.props) &&
           get("cuMemExportToShareableHandle", &f.export_fd) &&
           get("cuMemImportFromShareableHandle", &f.import_fd) && get("cuMemRelease", &f.release) &&
           get("cuMemAddressReserve", &f.reserve) && get("cuMemAddressFree", &f.free) &&
           get("cuMemMap", &f.map) && get("cuMemUnmap", &f.unmap) && get("cuMemSetAccess", &f.access) &&
           get("cuMemCreate", &f.create) && get("cuMemGetAllocationGranularity", &f.granularity);
    return f;
  }();
  return fns;
}

Status Cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status(r == CUDA_ERROR_OUT_OF_MEMORY ? Code::kResourceExhausted : Code::kInternal,
                std::string(what) + " failed with CUresult " + std::to_string(static_cast<int>(r)));
}

// Binds `device`'s primary context to this thread for driver calls.
Status UseDevice(int device) {
  FERRY_RETURN_IF_ERROR(ToStatus(cudaSetDevice(device), "cudaSetDevice"));
  return ToStatus(cudaFree(nullptr), "initialising the device's context");
}

void ClosePieces(std::vector<VmmPiece>& pieces) {
  for (auto& p : pieces)
    if (p.fd >= 0) (void)os::Env::Current()->Close(p.fd);
  pieces.clear();
}

// Once every piece of [va, va + total) is mapped (`error` ok), makes the range readable and
// writable from `device`; on any error unmaps the `mapped` bytes and frees the reservation.
Status SealRange(const VmmFns& f, CUdeviceptr va, uint64_t total, uint64_t mapped, int device, Status error) {
  if (error.ok()) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    error = Cu(f.access(va, total, &access, 1), "cuMemSetAccess");
  }
  if (!error.ok()) {
    if (mapped > 0) (void)f.unmap(va, mapped);
    (void)f.free(va, total);
  }
  return error;
}

Mutex g_vmm_mu;
std::map<uint64_t, uint64_t> g_vmm_allocs GUARDED_BY(g_vmm_mu);  // VmmAlloc's ranges, base -> size

}  // namespace

Result<VmmExport> VmmExportRange(const void* ptr, uint64_t bytes) {
  if (!Available()) return NotAvailable();
  const VmmFns& f = Vmm();
  if (!f.ok) return Status(Code::kUnsupported, "the CUDA driver has no VMM calls");
  FERRY_ASSIGN_OR_RETURN(PointerInfo info, QueryPointer(ptr));
  if (!info.device_memory) return Status(Code::kInvalidArgument, "pointer is not CUDA device memory");
  DeviceGuard guard(info.device);
  FERRY_RETURN_IF_ERROR(guard.status());
  FERRY_RETURN_IF_ERROR(UseDevice(info.device));
  const auto begin = reinterpret_cast<CUdeviceptr>(ptr);
  const CUdeviceptr end = begin + bytes;
  VmmExport out;
  CUdeviceptr at = begin;
  while (at < end || out.pieces.empty()) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (f.range(&base, &size, at) != CUDA_SUCCESS || size == 0 || (!out.pieces.empty() && base != at)) {
      ClosePieces(out.pieces);
      return Status(Code::kInvalidArgument, "the range has unmapped memory inside it");
    }
    CUmemGenericAllocationHandle h = 0;
    if (f.retain(&h, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) {
      ClosePieces(out.pieces);
      return Status(Code::kUnsupported, "not VMM memory (cuMemRetainAllocationHandle refuses it)");
    }
    CUmemAllocationProp prop = {};
    int fd = -1;
    CUresult r = f.props(&prop, h);
    if (r == CUDA_SUCCESS && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0)
      r = f.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    else if (r == CUDA_SUCCESS)
      r = CUDA_ERROR_NOT_SUPPORTED;
    (void)f.release(h);  // the retained reference
    if (r != CUDA_SUCCESS) {
      ClosePieces(out.pieces);
      return Status(Code::kUnsupported,
                    "a VMM allocation of the range is not shareable as a file descriptor (made without "
                    "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    }
    // Not inherited by programs this process starts (they would hold the memory).
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (out.pieces.empty()) out.base = reinterpret_cast<void*>(base);
    out.pieces.push_back(VmmPiece{fd, size});
    out.size += size;
    at = base + size;
  }
  return out;
}

Result<void*> VmmMapPieces(const std::vector<VmmPiece>& pieces, int device) {
  if (!Available()) return NotAvailable();
  const VmmFns& f = Vmm();
  if (!f.ok) return Status(Code::kUnsupported, "the CUDA driver has no VMM calls");
  if (pieces.empty()) return Status(Code::kInvalidArgument, "no allocation to map");
  uint64_t total = 0;
  for (const auto& p : pieces) total += p.size;
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  FERRY_RETURN_IF_ERROR(UseDevice(device));
  CUdeviceptr va = 0;
  FERRY_RETURN_IF_ERROR(Cu(f.reserve(&va, total, 0, 0, 0), "cuMemAddressReserve"));
  uint64_t mapped = 0;
  Status error;
  for (const auto& p : pieces) {
    CUmemGenericAllocationHandle h = 0;
    error = Cu(f.import_fd(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(p.fd)),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               "cuMemImportFromShareableHandle");
    if (!error.ok()) break;
    error = Cu(f.map(va + mapped, p.size, 0, h, 0), "cuMemMap");
    (void)f.release(h);  // the mapping holds the allocation from here on
    if (!error.ok()) break;
    mapped += p.size;
  }
  FERRY_RETURN_IF_ERROR(SealRange(f, va, total, mapped, device, std::move(error)));
  return reinterpret_cast<void*>(va);
}

Status VmmUnmap(void* base, uint64_t size) {
  if (!Available()) return NotAvailable();
  const VmmFns& f = Vmm();
  if (!f.ok) return Status(Code::kUnsupported, "the CUDA driver has no VMM calls");
  const auto va = reinterpret_cast<CUdeviceptr>(base);
  FERRY_RETURN_IF_ERROR(Cu(f.unmap(va, size), "cuMemUnmap"));
  return Cu(f.free(va, size), "cuMemAddressFree");
}

Result<void*> VmmAlloc(int device, uint64_t bytes, int pieces) {
  if (!Available()) return NotAvailable();
  const VmmFns& f = Vmm();
  if (!f.ok) return Status(Code::kUnsupported, "the CUDA driver has no VMM calls");
  if (pieces < 1 || bytes == 0) return Status(Code::kInvalidArgument, "VmmAlloc needs bytes and pieces");
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  FERRY_RETURN_IF_ERROR(UseDevice(device));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  FERRY_RETURN_IF_ERROR(Cu(f.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  const uint64_t per = (bytes / pieces + gran - 1) / gran * gran;
  const uint64_t total = per * pieces;
  CUdeviceptr va = 0;
  FERRY_RETURN_IF_ERROR(Cu(f.reserve(&va, total, 0, 0, 0), "cuMemAddressReserve"));
  Status error;
  uint64_t mapped = 0;
  for (int i = 0; i < pieces && error.ok(); ++i) {
    CUmemGenericAllocationHandle h = 0;
    error = Cu(f.create(&h, per, &prop, 0), "cuMemCreate");
    if (!error.ok()) break;
    error = Cu(f.map(va + mapped, per, 0, h, 0), "cuMemMap");
    (void)f.release(h);
    if (error.ok()) mapped += per;
  }
  FERRY_RETURN_IF_ERROR(SealRange(f, va, total, mapped, device, std::move(error)));
  MutexLock lock(&g_vmm_mu);
  g_vmm_allocs[va] = total;
  return reinterpret_cast<void*>(va);
}

Status VmmFree(void* base) {
  uint64_t size = 0;
  {
    MutexLock lock(&g_vmm_mu);
    auto it = g_vmm_allocs.find(reinterpret_cast<uint64_t>(base));
    if (it == g_vmm_allocs.end()) return Status(Code::kNotFound, "not a range VmmAlloc made");
    size = it->second;
    g_vmm_allocs.erase(it);
  }
  return VmmUnmap(base, size);
}

}  // namespace ferry::cuda
