// The CUDA seam of a build with the CUDA toolkit: calls go to the CUDA runtime (linked
// statically), which loads the driver at run time. With no driver or no device the probe fails
// once, is cached, and every call reports why instead of failing later in a worse place.
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"
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

}  // namespace ferry::cuda
