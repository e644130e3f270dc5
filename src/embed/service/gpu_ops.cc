#include "embed/service/gpu_ops.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/cuda_status.h"
#include "cuda/runtime.h"
#include "embed/service/protocol.h"

namespace ferry::embed::service::gpu {
namespace {

using cuda::ToStatus;

struct Driver {
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuMemGetAddressRange_v3020 range = nullptr;
  std::string error;
};

template <typename F>
void Find(const char* name, unsigned version, F* out, std::string* error) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr) {
    if (error->empty()) *error = std::string("driver entry point ") + name + " not found";
    (void)cudaGetLastError();
    return;
  }
  *out = reinterpret_cast<F>(fn);
}

const Driver& GetDriver() {
  static const Driver d = [] {
    Driver x;
    Find("cuStreamWaitValue32", 11070, &x.wait, &x.error);
    Find("cuStreamWriteValue32", 11070, &x.write, &x.error);
    Find("cuMemGetAddressRange", 3020, &x.range, &x.error);
    return x;
  }();
  return d;
}

Status FromCu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status(Code::kInternal, std::string(what) + ": CUresult " + std::to_string(r));
}

template <typename Query>
Status PollUntil(Query query, Deadline deadline, const char* what) {
  for (int spin = 0;; ++spin) {
    cudaError_t e = query();
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return ToStatus(e, what);
    if (deadline.expired())
      return Status(Code::kDeadlineExceeded, std::string(what) + " passed its deadline");
    if (spin > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

bool Usable(std::string* reason) {
  if (!cuda::Available()) {
    if (reason) *reason = cuda::UnavailableReason();
    return false;
  }
  const Driver& d = GetDriver();
  if (!d.error.empty()) {
    if (reason) *reason = d.error;
    return false;
  }
  return true;
}

Status SetDevice(int device) { return ToStatus(cudaSetDevice(device), "cudaSetDevice"); }

Result<void*> Malloc(size_t bytes) {
  void* p = nullptr;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMalloc(&p, bytes), "cudaMalloc"));
  return p;
}
Status Free(void* ptr) { return ToStatus(cudaFree(ptr), "cudaFree"); }

Status IpcHandleOf(void* ptr, std::string* handle, uint64_t* offset) {
  const Driver& d = GetDriver();
  if (d.range == nullptr) return Status(Code::kUnsupported, d.error);
  CUdeviceptr base = 0;
  size_t size = 0;
  FERRY_RETURN_IF_ERROR(
      FromCu(d.range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)), "cuMemGetAddressRange"));
  cudaIpcMemHandle_t h{};
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle"));
  static_assert(sizeof(h) == kCudaIpcHandleBytes);
  handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  *offset = reinterpret_cast<uint64_t>(ptr) - static_cast<uint64_t>(base);
  return Status::Ok();
}

Result<void*> IpcOpen(const std::string& handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t))
    return Status(Code::kInvalidArgument, "CUDA IPC handle of the wrong size");
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                                 "cudaIpcOpenMemHandle"));
  return p;
}
Result<uint64_t> AllocationBytes(void* base) {
  const Driver& d = GetDriver();
  if (d.range == nullptr) return Status(Code::kUnsupported, d.error);
  CUdeviceptr start = 0;
  size_t size = 0;
  FERRY_RETURN_IF_ERROR(
      FromCu(d.range(&start, &size, reinterpret_cast<CUdeviceptr>(base)), "cuMemGetAddressRange"));
  uint64_t skip = reinterpret_cast<uint64_t>(base) - static_cast<uint64_t>(start);
  return static_cast<uint64_t>(size) - skip;
}

Status IpcClose(void* base) {
  return ToStatus(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
}

Result<void*> StreamCreate() {
  cudaStream_t s = nullptr;
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  return static_cast<void*>(s);
}
Status StreamDestroy(void* stream) {
  return ToStatus(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}
Status StreamSync(void* stream, Deadline deadline) {
  return PollUntil([&] { return cudaStreamQuery(static_cast<cudaStream_t>(stream)); }, deadline,
                   "stream wait");
}
Result<void*> EventCreate() {
  cudaEvent_t e = nullptr;
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  return static_cast<void*>(e);
}
Status EventDestroy(void* event) {
  return ToStatus(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
}
Status EventRecord(void* event, void* stream) {
  return ToStatus(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
      "cudaEventRecord");
}
Status EventSync(void* event, Deadline deadline) {
  return PollUntil([&] { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }, deadline,
                   "event wait");
}

Status EventSpin(void* event, Deadline deadline) {
  for (int spin = 0;; ++spin) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return ToStatus(e, "event wait");
    if ((spin & 63) == 63 && deadline.expired())
      return Status(Code::kDeadlineExceeded, "event wait passed its deadline");
    std::this_thread::yield();
  }
}
Status StreamWaitEvent(void* stream, void* event) {
  return ToStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
      "cudaStreamWaitEvent");
}
Result<void*> HostAlloc(size_t bytes) {
  void* p = nullptr;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc"));
  return p;
}
Status HostFree(void* ptr) { return ToStatus(cudaFreeHost(ptr), "cudaFreeHost"); }

Status MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return ToStatus(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
      "cudaMemcpyAsync");
}
Status MemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  return ToStatus(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)),
                  "cudaMemsetAsync");
}

Status StreamWaitGeq(void* stream, uint32_t* flag, uint32_t value) {
  const Driver& d = GetDriver();
  if (d.wait == nullptr) return Status(Code::kUnsupported, d.error);
  return FromCu(d.wait(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                       CU_STREAM_WAIT_VALUE_GEQ),
                "cuStreamWaitValue32");
}
Status StreamWrite(void* stream, uint32_t* flag, uint32_t value) {
  const Driver& d = GetDriver();
  if (d.write == nullptr) return Status(Code::kUnsupported, d.error);
  return FromCu(d.write(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                        CU_STREAM_WRITE_VALUE_DEFAULT),
                "cuStreamWriteValue32");
}

}  // namespace ferry::embed::service::gpu
