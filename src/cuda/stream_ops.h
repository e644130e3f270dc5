// Streams, events, asynchronous copies and stream memory operations: the CUDA calls of the
// embedding-offload service and client (and of tools that time GPU copies), behind a header
// that includes no CUDA header, beside runtime.h (devices, registration, IPC, allocation).
// stream_ops.cc reaches the runtime (linked statically) and the driver's stream memory
// operations through cudaGetDriverEntryPointByVersion, so no program links libcuda;
// stream_ops_none.cc, in builds without CUDA, reports kUnsupported for every call.
//
// Streams and events are opaque pointers (cudaStream_t, cudaEvent_t; a null stream is the
// legacy default stream). Device pointers are plain pointers (UVA). The calls act on the
// calling thread's current device: SetDevice first.
//
// Thread safety: every function may be called from any thread; a stream's work is ordered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/deadline.h"
#include "ferry/status.h"

namespace ferry::cuda {

// True when CUDA is available (runtime.h's Available()) and the driver has the stream memory
// operations (cuStreamWaitValue32, cuStreamWriteValue32); otherwise why not in *reason.
bool StreamOpsUsable(std::string* reason);
// Makes `device` the calling thread's current device.
Status SetDevice(int device);

Result<void*> StreamCreate();  // non-blocking with respect to the legacy default stream
Status StreamDestroy(void* stream);
// Waits until the stream's work is done (polling, then sleeping briefly), or
// kDeadlineExceeded.
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

// Any direction (UVA), ordered on `stream`.
Status MemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
Status MemsetAsync(void* dst, int value, size_t bytes, void* stream);

// Stream memory operations on a 32-bit word of device (or registered host) memory:
// the stream waits until *flag >= value (CU_STREAM_WAIT_VALUE_GEQ); capturable in a graph.
Status StreamWaitGeq(void* stream, uint32_t* flag, uint32_t value);
// Writes value to *flag once the stream's earlier work is done (CU_STREAM_WRITE_VALUE_DEFAULT).
Status StreamWrite(void* stream, uint32_t* flag, uint32_t value);

}  // namespace ferry::cuda
