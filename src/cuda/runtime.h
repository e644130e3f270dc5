// ferry's seam over the CUDA runtime: the calls the engine and transports make, behind one
// header that includes no CUDA header, so every layer builds with or without the toolkit.
// In a build without CUDA (runtime_none.cc) every call reports kUnsupported and Available()
// is false; with CUDA (runtime.cc) the calls go to the CUDA runtime, which loads the driver at
// run time, so binaries start on machines without a GPU and report it.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::cuda {

// True when this build was compiled with the CUDA toolkit.
bool Built();
// True when this build has CUDA and a driver with at least one device.
bool Available();
// Why Available() is false ("built without CUDA", "no CUDA driver", ...); empty when true.
std::string UnavailableReason();
int DeviceCount();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};
std::vector<DeviceInfo> Devices();

// Page-locks host memory so GPU copies and kernels reach it directly.
Status HostRegister(void* ptr, size_t bytes);
// The same for memory the process may only read (a PROT_READ file mapping): the GPU only
// reads it either.
Status HostRegisterReadOnly(void* ptr, size_t bytes);
Status HostUnregister(void* ptr);

struct PointerInfo {
  bool device_memory = false;  // allocated on a device (cudaMalloc, cuMem)
  int device = -1;
};
Result<PointerInfo> QueryPointer(const void* ptr);

// Test helpers: device memory and copies for tests and benchmarks.
Result<void*> Malloc(int device, size_t bytes);
Status Free(void* ptr);
Status CopySync(void* dst, const void* src, size_t bytes);   // any direction (UVA)
Status MemsetSync(void* ptr, int value, size_t bytes);

}  // namespace ferry::cuda
