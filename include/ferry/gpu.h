// GPU memory and streams for programs that hand ferry GPU buffers: the `ferry` CLI's
// benchmarks and demos, examples and tests. Device memory, page-locked host memory, and a
// stream with one completion event (for work that ferry's calls take a stream for, such as
// the embedding client's, and for timing copies). In a build without CUDA, or on a machine
// without a usable GPU, every call fails (kUnsupported or kFailedPrecondition) and
// Available() is false with the reason.
//
// Thread safety: the free functions may be called from any thread; a Stream is used by one
// thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "ferry/status.h"

namespace ferry::gpu {

// True when a device can be used (with the stream memory operations ferry needs); otherwise
// false, and why in *reason when it is not null.
bool Available(std::string* reason = nullptr);

// Device memory on `device`.
Result<void*> DeviceAlloc(int device, size_t bytes);
Status DeviceFree(void* ptr);
// Synchronous copies in any direction (unified addressing) and device memsets.
Status CopySync(void* dst, const void* src, size_t bytes);
Status MemsetSync(void* ptr, int value, size_t bytes);
// Page-locked host memory: copies between it and a device are asynchronous.
Result<void*> PinnedAlloc(size_t bytes);
Status PinnedFree(void* ptr);

// A CUDA stream (non-blocking with respect to the legacy default stream) on one device.
class Stream {
 public:
  static Result<std::unique_ptr<Stream>> Create(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The cudaStream_t, for ferry calls that take a stream.
  void* handle() const;
  // Enqueues a copy (any direction) on the stream.
  Status CopyAsync(void* dst, const void* src, size_t bytes);
  // Enqueues a kernel that keeps the stream busy on the GPU for `duration` (it spins on the
  // GPU's timer): a stand-in for a model layer's kernels. Returns once it is enqueued.
  // kInvalidArgument for a negative duration or one over a minute; zero enqueues nothing.
  Status Spin(std::chrono::nanoseconds duration);
  // Waits until the work enqueued so far is done, spinning (no sleep, so the completion is seen
  // within microseconds), or kDeadlineExceeded after `timeout`.
  Status Sync(std::chrono::nanoseconds timeout);

 private:
  Stream(int device, void* stream, void* event);
  int device_;
  void* stream_;
  void* event_;
};

// A CUDA event (timing disabled), for work that other threads wait on: record it on a stream
// after a layer's kernels, and hand the connector kv::EventReady(event.handle()).
class Event {
 public:
  static Result<std::unique_ptr<Event>> Create(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void* handle() const { return event_; }  // the cudaEvent_t
  // Captures the work enqueued on `stream` (a cudaStream_t; null: the legacy default stream).
  Status Record(void* stream);

 private:
  Event(int device, void* event) : device_(device), event_(event) {}
  int device_;
  void* event_;
};

// Waits until the work captured by `event` (a cudaEvent_t, e.g. torch.cuda.Event's cuda_event)
// is done, spinning and yielding, or kDeadlineExceeded after `timeout`.
Status WaitEvent(void* event, std::chrono::nanoseconds timeout);

}  // namespace ferry::gpu
