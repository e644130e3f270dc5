// The CUDA calls of the embedding-offload service and client, behind a header that includes no
// CUDA header (the seam style of src/cuda/runtime.h). gpu_ops.cc reaches the runtime (linked
// statically) and the driver's stream memory operations through
// cudaGetDriverEntryPointByVersion, so no program links libcuda; gpu_ops_none.cc, in builds
// without CUDA, reports kUnsupported for every call.
//
// Streams and events are opaque pointers (cudaStream_t, cudaEvent_t). Device pointers are
// plain pointers (UVA).
//
// Thread safety: every function may be called from any thread; a stream's work is ordered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/deadline.h"
#include "ferry/status.h"

namespace ferry::embed::service::gpu {

// True when this build has CUDA and a device is usable; otherwise why not in *reason.
bool Usable(std::string* reason);
Status SetDevice(int device);

Result<void*> Malloc(size_t bytes);
Status Free(void* ptr);

// The IPC handle (kCudaIpcHandleBytes bytes) of the allocation that holds `ptr`, and ptr's
// offset in it (a caching allocator's tensors are pieces of larger allocations).
Status IpcHandleOf(void* ptr, std::string* handle, uint64_t* offset);
// Opens another process's handle on the current device; its allocation's base.
Result<void*> IpcOpen(const std::string& handle);
// Bytes of the allocation that starts at `base` (an IpcOpen result), for bounds checks.
Result<uint64_t> AllocationBytes(void* base);
Status IpcClose(void* base);

Result<void*> StreamCreate();  // non-blocking with respect to the legacy default stream
Status StreamDestroy(void* stream);
// Waits until the stream's work is done, or kDeadlineExceeded.
Status StreamSync(void* stream, Deadline deadline);
Result<void*> EventCreate();  // timing disabled
Status EventDestroy(void* event);
Status EventRecord(void* event, void* stream);
// Waits until the event completed, or kDeadlineExceeded.
Status EventSync(void* event, Deadline deadline);

// Waits like EventSync but without sleeping: spins and yields until the event completed (for
// timing a completion to a few microseconds), or kDeadlineExceeded.
Status EventSpin(void* event, Deadline deadline);
// Makes `stream` wait for the event's completion (cudaStreamWaitEvent), across devices too.
Status StreamWaitEvent(void* stream, void* event);
// Page-locked host memory (cudaHostAlloc, portable): device copies to and from it are
// asynchronous.
Result<void*> HostAlloc(size_t bytes);
Status HostFree(void* ptr);

Status MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
Status MemsetAsync(void* dst, int value, size_t bytes, void* stream);

// Stream memory operations on a 32-bit word of device (or registered host) memory:
// the stream waits until *flag >= value (CU_STREAM_WAIT_VALUE_GEQ); capturable in a graph.
Status StreamWaitGeq(void* stream, uint32_t* flag, uint32_t value);
// Writes value to *flag once the stream's earlier work is done (CU_STREAM_WRITE_VALUE_DEFAULT).
Status StreamWrite(void* stream, uint32_t* flag, uint32_t value);

}  // namespace ferry::embed::service::gpu
