// ferry/gpu.h over the CUDA seam (runtime.h, stream_ops.h); no CUDA header here, so the same
// file serves builds with and without CUDA.
#include "ferry/gpu.h"

#include "cuda/runtime.h"
#include "cuda/stream_ops.h"
#include "cuda/uva_kernels.h"

namespace ferry::gpu {

bool Available(std::string* reason) { return cuda::StreamOpsUsable(reason); }

Result<void*> DeviceAlloc(int device, size_t bytes) { return cuda::Malloc(device, bytes); }
Status DeviceFree(void* ptr) { return cuda::Free(ptr); }
Status CopySync(void* dst, const void* src, size_t bytes) {
  return cuda::CopySync(dst, src, bytes);
}
Status MemsetSync(void* ptr, int value, size_t bytes) {
  return cuda::MemsetSync(ptr, value, bytes);
}
Result<void*> PinnedAlloc(size_t bytes) { return cuda::HostAlloc(bytes); }
Status PinnedFree(void* ptr) { return cuda::HostFree(ptr); }

Result<std::unique_ptr<Stream>> Stream::Create(int device) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device));
  FERRY_ASSIGN_OR_RETURN(void* stream, cuda::StreamCreate());
  Result<void*> event = cuda::EventCreate();
  if (!event.ok()) {
    (void)cuda::StreamDestroy(stream);
    return event.status();
  }
  return std::unique_ptr<Stream>(new Stream(device, stream, *event));
}

Stream::Stream(int device, void* stream, void* event)
    : device_(device), stream_(stream), event_(event) {}

Stream::~Stream() {
  (void)cuda::SetDevice(device_);
  (void)cuda::EventDestroy(event_);
  (void)cuda::StreamDestroy(stream_);
}

void* Stream::handle() const { return stream_; }

Status Stream::CopyAsync(void* dst, const void* src, size_t bytes) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
  return cuda::MemcpyAsync(dst, src, bytes, stream_);
}

Status Stream::Spin(std::chrono::nanoseconds duration) {
  if (duration.count() < 0 || duration > std::chrono::minutes(1))
    return Status(Code::kInvalidArgument, "Stream::Spin: the duration must be in [0, 60 s]");
  if (duration.count() == 0) return Status::Ok();
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
  const int rc = cuda::LaunchSpin(static_cast<uint64_t>(duration.count()),
                                  static_cast<CUstream_st*>(stream_));
  if (rc == cuda::kLaunchUnsupported)
    return Status(Code::kUnsupported, "Stream::Spin: ferry was built without CUDA");
  if (rc != 0)
    return Status(Code::kInternal, "Stream::Spin: the kernel launch failed (cudaError_t " +
                                       std::to_string(rc) + ")");
  return Status::Ok();
}

Status Stream::Sync(std::chrono::nanoseconds timeout) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
  FERRY_RETURN_IF_ERROR(cuda::EventRecord(event_, stream_));
  return cuda::EventSpin(event_, Deadline::After(timeout));
}

Result<std::unique_ptr<Event>> Event::Create(int device) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device));
  FERRY_ASSIGN_OR_RETURN(void* event, cuda::EventCreate());
  return std::unique_ptr<Event>(new Event(device, event));
}

Event::~Event() {
  (void)cuda::SetDevice(device_);
  (void)cuda::EventDestroy(event_);
}

Status Event::Record(void* stream) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
  return cuda::EventRecord(event_, stream);
}

Status WaitEvent(void* event, std::chrono::nanoseconds timeout) {
  if (event == nullptr) return Status(Code::kInvalidArgument, "no CUDA event");
  return cuda::EventSpin(event, Deadline::After(timeout));
}

}  // namespace ferry::gpu
