// Turns CUDA runtime errors into ferry::Status values, and keeps the calling thread's current
// device unchanged across calls that must run on another one. Internal to src/cuda and to
// the transports' CUDA paths (.cc files only: it includes the CUDA runtime header).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::cuda {

// OK for cudaSuccess; otherwise "<what>: <CUDA error name>: <CUDA error string>" with a code
// that says what the caller can do. Clears the thread's last (non-sticky) CUDA error so that
// other code that checks cudaGetLastError() does not see an error ferry already handled.
inline Status ToStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  Code code = Code::kInternal;
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
      code = Code::kInvalidArgument;
      break;
    case cudaErrorMemoryAllocation:
      code = Code::kResourceExhausted;
      break;
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorPeerAccessAlreadyEnabled:
      code = Code::kAlreadyExists;
      break;
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorPeerAccessNotEnabled:
      code = Code::kNotFound;
      break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorNotSupported:
    case cudaErrorPeerAccessUnsupported:
      code = Code::kUnsupported;
      break;
    case cudaErrorCudartUnloading:
      code = Code::kAborted;
      break;
    default:
      break;
  }
  return Status(code, std::string(what) + ": " + cudaGetErrorName(error) + ": " +
                          cudaGetErrorString(error));
}

// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaError_t error = cudaGetDevice(&previous_);
    if (error != cudaSuccess) {
      status_ = ToStatus(error, "cudaGetDevice");
      previous_ = -1;
      return;
    }
    if (previous_ != device) status_ = ToStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_)
      (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace ferry::cuda
