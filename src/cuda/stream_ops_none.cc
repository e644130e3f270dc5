// stream_ops.h in a build without CUDA: every call reports kUnsupported.
#include "cuda/stream_ops.h"

namespace ferry::cuda {
namespace {
Status No() { return Status(Code::kUnsupported, "ferry was built without CUDA"); }
}  // namespace

bool StreamOpsUsable(std::string* reason) {
  if (reason) *reason = "ferry was built without CUDA";
  return false;
}
Status SetDevice(int) { return No(); }
Result<void*> StreamCreate() { return No(); }
Status StreamDestroy(void*) { return No(); }
Status StreamSync(void*, Deadline) { return No(); }
Result<void*> EventCreate() { return No(); }
Status EventDestroy(void*) { return No(); }
Status EventRecord(void*, void*) { return No(); }
Status EventSync(void*, Deadline) { return No(); }
Status EventSpin(void*, Deadline) { return No(); }
Status StreamWaitEvent(void*, void*) { return No(); }
Result<void*> HostAlloc(size_t) { return No(); }
Status HostFree(void*) { return No(); }
Status MemcpyAsync(void*, const void*, size_t, void*) { return No(); }
Status MemsetAsync(void*, int, size_t, void*) { return No(); }
Status StreamWaitGeq(void*, uint32_t*, uint32_t) { return No(); }
Status StreamWrite(void*, uint32_t*, uint32_t) { return No(); }

}  // namespace ferry::cuda
