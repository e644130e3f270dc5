// ferry's seam over the CUDA runtime: the calls the engine and transports make, behind one
// header that includes no CUDA header, so every layer builds with or without the toolkit.
// In a build without CUDA (runtime_none.cc) every call reports kUnsupported and Available()
// is false; with CUDA (runtime.cc) the calls go to the CUDA runtime, which loads the driver at
// run time, so binaries start on machines without a GPU and report it.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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

// The CUDA architectures this build's kernels were compiled for, CMake's list with spaces
// ("80-real 86-real 90-real 120": "-real" is machine code only, a bare number adds PTX that
// newer devices compile at load); empty in a build without CUDA.
std::string BuiltArchitectures();
// Whether ferry's kernels load on `device`, probed once per device and cached: OK;
// kUnsupported with KernelsUnsupportedMessage when this build has no code the device can run
// (an sm_80 device and a build for sm_90 only); kFailedPrecondition when CUDA is not
// available; kInvalidArgument for a device that does not exist.
Status KernelsLoad(int device);
// That refusal's message, e.g. "ferry's CUDA kernels cannot run on device 0 (NVIDIA A100,
// sm_80): this build has code for sm_90 only (...); rebuild ferry with
// -DFERRY_CUDA_ARCHS=\"80-real;...\"". `cuda_error` is the CUDA runtime's description.
std::string KernelsUnsupportedMessage(const DeviceInfo& device, std::string_view built_archs,
                                      std::string_view cuda_error);
// "80-real;90;100-virtual" (or space-separated) as a person reads it: "sm_80, sm_90 + PTX 90, PTX 100".
std::string DescribeArchitectures(std::string_view archs);

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

// CUDA IPC: a device allocation exported by one process and mapped by another on the same host.
// A process cannot open a handle it exported itself (CUDA refuses); see also ipc_api.h, the
// injectable form of these calls that the cuda_ipc transport uses.
inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
struct IpcHandle {
  std::array<uint8_t, kIpcHandleBytes> bytes{};
  friend bool operator==(const IpcHandle&, const IpcHandle&) = default;
};
struct AllocationRange {
  void* base = nullptr;  // start of the allocation (cudaMalloc block) containing a pointer
  uint64_t size = 0;
};
// The allocation containing `ptr` (cuMemGetAddressRange, reached through the runtime's driver
// entry point: no ferry binary links libcuda).
Result<AllocationRange> GetAllocationRange(const void* ptr);
// The IPC handle of the allocation starting at `allocation_base`.
Result<IpcHandle> IpcGetHandle(void* allocation_base);
// Maps another process's allocation into this process, addressable from `device` (peer access
// enabled lazily when the allocation lives on another device). Returns the mapped base.
Result<void*> IpcOpenHandle(const IpcHandle& handle, int device);
Status IpcCloseHandle(void* mapped_base);

// GPU memory mapped with the VMM API (cuMemCreate + cuMemMap: PyTorch's expandable segments,
// sleep-mode allocators) has no IPC handle. Its physical allocations are shared instead as
// POSIX file descriptors, one per allocation the range spans, mapped in order.
struct VmmPiece {
  int fd = -1;        // a descriptor of the allocation, in the process that holds it
  uint64_t size = 0;  // bytes of it that are mapped
  friend bool operator==(const VmmPiece&, const VmmPiece&) = default;
};
struct VmmExport {
  void* base = nullptr;  // where the first allocation is mapped (at or before the range)
  uint64_t size = 0;     // the pieces' sizes added up
  std::vector<VmmPiece> pieces;
};
// Exports the allocations that back [ptr, ptr + bytes): kUnsupported when that is not VMM
// memory, or its allocations were not made shareable as descriptors; kInvalidArgument when
// the range has a hole. The caller owns (and closes) the descriptors.
Result<VmmExport> VmmExportRange(const void* ptr, uint64_t bytes);
// Maps the allocations of `pieces` (descriptors of this process, left open) one after the
// other into a new range, readable and writable from `device`. Returns its base.
Result<void*> VmmMapPieces(const std::vector<VmmPiece>& pieces, int device);
// Unmaps a range VmmMapPieces made (`size`: the pieces' sizes added up).
Status VmmUnmap(void* base, uint64_t size);
// `bytes` (rounded up) of memory on `device` made of `pieces` allocations, shareable as
// descriptors, mapped as one range: memory as a VMM allocator makes it (tests, tools).
Result<void*> VmmAlloc(int device, uint64_t bytes, int pieces);
Status VmmFree(void* base);

}  // namespace ferry::cuda
