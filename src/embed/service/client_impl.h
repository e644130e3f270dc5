// Client::Impl: the state of an embedding-offload client (ferry/embed_service.h), shared by the files that
// implement it: client_setup.cc (allocation and registration), client_threads.cc (the reader
// of the service's replies and, in CUDA mode, the sender of requests whose input copies are in
// flight) and client.cc (the per-forward calls and the accessors). Internal to the client.
//
// Thread safety: the fields marked GUARDED_BY(mu) are read and written under `mu`; aux_mu
// orders the auxiliary stream's work (failure writes, flag reads; the stream itself is not a
// field it could guard); the rest is set up by Create() before any thread starts and
// read-only after, except the atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "cuda/runtime.h"
#include "cuda/stream_ops.h"
#include "embed/service/host_flag.h"
#include "embed/service/protocol.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"
#include "ferry/embed_service.h"

namespace ferry::embed::service {

inline constexpr uint64_t kClientAlign = 64;
inline constexpr int kClientEvents = 4;  // steps whose input copies may be in flight at once
inline constexpr auto kClientFlagTimeout = std::chrono::seconds(2);
inline uint64_t ClientAlignUp(uint64_t v) {
  return (v + kClientAlign - 1) / kClientAlign * kClientAlign;
}

struct Client::Impl {
  ClientOptions options;
  bool cuda = false;
  std::unique_ptr<SharedMemory> inputs;
  bool inputs_pinned = false;
  InputOffsets input_offsets;
  std::unique_ptr<SharedMemory> outputs;  // host mode
  std::vector<uint64_t> output_offsets, flag_offsets;
  // CUDA mode.
  void* allocation = nullptr;  // owned when the client allocated the outputs
  std::vector<uint8_t*> dev_outputs;
  std::vector<uint32_t*> dev_flags;
  void* aux_stream = nullptr;  // failure writes and flag reads
  Mutex aux_mu;

  UniqueFd fd;
  UniqueFd wake_fd;
  std::thread reader;
  std::atomic<uint64_t> last_seq{0};  // the latest step sent
  // A forward was prepared and its outputs not released yet (the driving thread's).
  std::atomic<bool> outstanding{false};

  // CUDA mode, rank 0: steps whose input copies are in flight, sent by `sender`.
  struct Pending {
    Request request;
    void* event;
  };
  std::thread sender;
  std::deque<Pending> to_send GUARDED_BY(mu);
  std::vector<void*> free_events GUARDED_BY(mu);
  std::vector<void*> all_events;

  Mutex mu;
  CondVar cv;
  Status pending GUARDED_BY(mu);  // a step's error not yet reported
  Status fatal GUARDED_BY(mu);    // sticky
  std::map<uint64_t, Deadline> waiting GUARDED_BY(mu);  // steps sent, not answered
  bool closed GUARDED_BY(mu) = false;

  ~Impl() {
    if (cuda) {
      (void)cuda::SetDevice(options.device);
      if (aux_stream != nullptr) (void)cuda::StreamDestroy(aux_stream);
      for (void* e : all_events) (void)cuda::EventDestroy(e);
      if (allocation != nullptr) (void)cuda::Free(allocation);
    }
    if (inputs_pinned) (void)cuda::HostUnregister(inputs->data());
  }

  uint32_t* Flag(size_t slot) const {
    return reinterpret_cast<uint32_t*>(outputs->data() + flag_offsets[slot]);
  }
  // Sets every flag to FAILED, so that no wait stays blocked. Touches nothing `mu` guards: it
  // may be called with mu held or not.
  void FailAll() EXCLUDES(aux_mu) {
    if (!cuda) {
      for (size_t s = 0; s < flag_offsets.size(); ++s) StoreFlag(Flag(s), kFlagFailed);
      return;
    }
    MutexLock lock(&aux_mu);
    (void)cuda::SetDevice(options.device);
    for (uint32_t* f : dev_flags) (void)cuda::StreamWrite(aux_stream, f, kFlagFailed);
    (void)cuda::StreamSync(aux_stream, Deadline::After(kClientFlagTimeout));
  }
  void SetFatal(Status s) REQUIRES(mu) {
    if (fatal.ok()) fatal = std::move(s);
  }
  void Read() EXCLUDES(mu);
  void SendLoop() EXCLUDES(mu);
  Status SendRequest(const Request& r) EXCLUDES(mu);
  // The error to report now, if any (the pending one is reported once).
  Status TakeError() EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (closed) return Status(Code::kFailedPrecondition, "the client is closed");
    if (!fatal.ok()) return pending.ok() ? fatal : std::exchange(pending, Status::Ok());
    return std::exchange(pending, Status::Ok());
  }
  Status SetUpCuda(Register* reg);
};

}  // namespace ferry::embed::service
