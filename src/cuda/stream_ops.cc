// stream_ops.h with CUDA: the runtime's stream, event and copy calls, and the driver's stream
// memory operations looked up once through the runtime (the driver is loaded at run time).
#include "cuda/stream_ops.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "cuda/cuda_status.h"
#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {

struct MemOps {
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  std::string error;  // empty when both were found
};

template <typename F>
void Find(const char* name, F* out, std::string* error) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 11070, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr) {
    if (error->empty()) *error = std::string("driver entry point ") + name + " not found";
    (void)cudaGetLastError();
    return;
  }
  *out = reinterpret_cast<F>(fn);
}

const MemOps& GetMemOps() {
  static const MemOps ops = [] {
    MemOps x;
    Find("cuStreamWaitValue32", &x.wait, &x.error);
    Find("cuStreamWriteValue32", &x.write, &x.error);
    return x;
  }();
  return ops;
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

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t E(void* event) { return static_cast<cudaEvent_t>(event); }

}  // namespace

bool StreamOpsUsable(std::string* reason) {
  if (!Available()) {
    if (reason) *reason = UnavailableReason();
    return false;
  }
  const MemOps& ops = GetMemOps();
  if (!ops.error.empty()) {
    if (reason) *reason = ops.error;
    return false;
  }
  return true;
}

Status SetDevice(int device) { return ToStatus(cudaSetDevice(device), "cudaSetDevice"); }

Result<void*> StreamCreate() {
  cudaStream_t s = nullptr;
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  return static_cast<void*>(s);
}
Status StreamDestroy(void* stream) {
  return ToStatus(cudaStreamDestroy(S(stream)), "cudaStreamDestroy");
}
Status StreamSync(void* stream, Deadline deadline) {
  return PollUntil([&] { return cudaStreamQuery(S(stream)); }, deadline, "stream wait");
}
Result<void*> EventCreate() {
  cudaEvent_t e = nullptr;
  FERRY_RETURN_IF_ERROR(
      ToStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  return static_cast<void*>(e);
}
Status EventDestroy(void* event) {
  return ToStatus(cudaEventDestroy(E(event)), "cudaEventDestroy");
}
Status EventRecord(void* event, void* stream) {
  return ToStatus(cudaEventRecord(E(event), S(stream)), "cudaEventRecord");
}
Status EventSync(void* event, Deadline deadline) {
  return PollUntil([&] { return cudaEventQuery(E(event)); }, deadline, "event wait");
}
Status EventSpin(void* event, Deadline deadline) {
  for (int spin = 0;; ++spin) {
    cudaError_t e = cudaEventQuery(E(event));
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return ToStatus(e, "event wait");
    if ((spin & 63) == 63 && deadline.expired())
      return Status(Code::kDeadlineExceeded, "event wait passed its deadline");
    std::this_thread::yield();
  }
}
Status StreamWaitEvent(void* stream, void* event) {
  return ToStatus(cudaStreamWaitEvent(S(stream), E(event), 0), "cudaStreamWaitEvent");
}

Result<void*> HostAlloc(size_t bytes) {
  void* p = nullptr;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc"));
  return p;
}
Status HostFree(void* ptr) { return ToStatus(cudaFreeHost(ptr), "cudaFreeHost"); }

Status MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream)),
                  "cudaMemcpyAsync");
}
Status MemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  return ToStatus(cudaMemsetAsync(dst, value, bytes, S(stream)), "cudaMemsetAsync");
}

Status StreamWaitGeq(void* stream, uint32_t* flag, uint32_t value) {
  const MemOps& ops = GetMemOps();
  if (ops.wait == nullptr) return Status(Code::kUnsupported, ops.error);
  return FromCu(ops.wait(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                         CU_STREAM_WAIT_VALUE_GEQ),
                "cuStreamWaitValue32");
}
Status StreamWrite(void* stream, uint32_t* flag, uint32_t value) {
  const MemOps& ops = GetMemOps();
  if (ops.write == nullptr) return Status(Code::kUnsupported, ops.error);
  return FromCu(ops.write(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                          CU_STREAM_WRITE_VALUE_DEFAULT),
                "cuStreamWriteValue32");
}

}  // namespace ferry::cuda
