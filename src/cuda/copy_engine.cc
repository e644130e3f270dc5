#include "cuda/copy_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cuda/copy_engine_core.h"
#include "cuda/cuda_status.h"
#include "cuda/runtime.h"

namespace ferry::cuda {

CopyEngine::Core::~Core() {
  DeviceGuard guard(device);
  SyncStreams();
  if (upload_stream != nullptr) (void)cudaStreamSynchronize(upload_stream);
  for (cudaEvent_t e : free_events) (void)cudaEventDestroy(e);
  for (int i = 0; i < kStageSlots; ++i) {
    if (stage_handoff[i] != nullptr) (void)cudaEventDestroy(stage_handoff[i]);
    if (stage_free[i] != nullptr) (void)cudaEventDestroy(stage_free[i]);
  }
  if (staging != nullptr) (void)cudaFree(staging);
  for (OpSlot& slot : op_slots) {  // no handle is left: each holds the core
    if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
  }
  if (stage_stream != nullptr) (void)cudaStreamDestroy(stage_stream);
  if (upload_event != nullptr) (void)cudaEventDestroy(upload_event);
  if (host_ring != nullptr) (void)cudaFreeHost(host_ring);
  if (device_ring != nullptr) (void)cudaFree(device_ring);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  if (stream2 != nullptr) (void)cudaStreamDestroy(stream2);
  if (upload_stream != nullptr) (void)cudaStreamDestroy(upload_stream);
  (void)cudaGetLastError();
}

Status CopyEngine::Core::Init(int ordinal) {
  // A build without code for this GPU's architecture fails here, with the reason, rather than
  // at the first launch inside a transfer.
  FERRY_RETURN_IF_ERROR(KernelsLoad(ordinal));
  device = ordinal;
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  int sms = 0;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                                 "cudaDeviceGetAttribute"));
  // Two blocks per SM between GPU memory, one with host memory on a side; the kernel's
  // grid-stride loop covers larger batches. Measured on an H200 (bench/results/cuda_ipc.md,
  // 2026-12-03): with pieces scattered on both sides of one GPU (bench/copy_kernel_probe.cu)
  // one block per SM reached 0.83-0.85 of a device copy and two 0.91-0.95; with the source in
  // order (ferry_bench_cuda's kv_d2d) two were 2-4% faster than one, and four no faster than
  // two. To pinned host memory two were up to 5% slower than one (copy_sweep_h200.md: 1%).
  max_blocks = static_cast<uint32_t>(2 * std::max(sms, 1));
  host_blocks = static_cast<uint32_t>(std::max(sms, 1));
  FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags"));
  FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&stream2, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags (second launch stream)"));
  // Descriptors go up on a stream of their own, so that a launch's upload runs while the
  // launch before it copies (on one stream each upload waited for the previous kernel).
  FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&upload_stream, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags (descriptor uploads)"));
  FERRY_RETURN_IF_ERROR(ToStatus(cudaEventCreateWithFlags(&upload_event, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags (descriptor uploads)"));
  const size_t ring_bytes = kRingPieces * sizeof(Piece);
  FERRY_RETURN_IF_ERROR(ToStatus(cudaHostAlloc(reinterpret_cast<void**>(&host_ring), ring_bytes,
                                               cudaHostAllocPortable | cudaHostAllocMapped),
                                 "cudaHostAlloc (descriptor ring)"));
  // Without a device address for the ring (a platform without mapped host memory) nothing
  // is staged (StagingLocked); everything else works as before.
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped_ring), host_ring, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    mapped_ring = nullptr;
  }
  return ToStatus(cudaMalloc(reinterpret_cast<void**>(&device_ring), ring_bytes),
                  "cudaMalloc (descriptor ring)");
}

std::optional<OpBuffer> CopyEngine::Core::ReserveOps(const std::shared_ptr<Core>& self, size_t n) {
  if (n == 0 || n > kOpBufferOps) return std::nullopt;
  int index = -1;
  OpSlot slot;
  {
    MutexLock lock(&mu);
    if (op_slots_failed) return std::nullopt;
    for (int i = 0; i < kOpBuffers && index < 0; ++i) {
      if (op_slots[i].busy) continue;
      op_slots[i].busy = true;
      index = i;
      slot = op_slots[i];
    }
  }
  if (index < 0) return std::nullopt;
  if (slot.host == nullptr) {
    // Made outside the lock (a few milliseconds, once per buffer); the slot is ours meanwhile.
    const size_t bytes = kOpBufferOps * sizeof(TransferOp);
    DeviceGuard guard(device);
    bool made = guard.status().ok() && cudaHostAlloc(reinterpret_cast<void**>(&slot.host), bytes,
                                                     cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess;
    made = made && cudaHostGetDevicePointer(&slot.mapped, slot.host, 0) == cudaSuccess;
    MutexLock lock(&mu);
    if (!made) {
      (void)cudaGetLastError();
      if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
      op_slots[index].busy = false;
      op_slots_failed = true;
      return std::nullopt;
    }
    op_slots[index].host = slot.host;
    op_slots[index].mapped = slot.mapped;
  }
  OpBuffer buffer;
  buffer.ops = slot.host;
  buffer.capacity = kOpBufferOps;
  buffer.mapped_ops = slot.mapped;
  buffer.owner = this;
  // The handle keeps the core (and so the memory) alive; the last copy gives the slot back.
  buffer.hold = std::shared_ptr<void>(slot.host, [self, index](void*) {
    MutexLock lock(&self->mu);
    self->op_slots[index].busy = false;
  });
  return buffer;
}

std::optional<OpBuffer> CopyEngine::ReserveOps(size_t n) { return core_->ReserveOps(core_, n); }

bool CopyEngine::Core::AllocRingLocked(size_t n, size_t* at) {
  if (ring_users == 0) head = tail = 0;
  // head == tail means empty, so an allocation never makes head catch up with tail.
  if (head >= tail) {
    if (kRingPieces - head >= n) {
      *at = head;
      head += n;
      return true;
    }
    if (tail > n) {
      *at = 0;
      head = n;
      return true;
    }
    return false;
  }
  if (tail - head > n) {
    *at = head;
    head += n;
    return true;
  }
  return false;
}

void CopyEngine::Core::ReleaseEventLocked(cudaEvent_t event) {
  if (event == completer_event) {
    completer_event_released = true;  // the completer returns it once it wakes
  } else {
    free_events.push_back(event);
  }
}

void CopyEngine::Core::SyncStreams() {
  if (stream != nullptr) (void)cudaStreamSynchronize(stream);
  if (stream2 != nullptr) (void)cudaStreamSynchronize(stream2);
  if (stage_stream != nullptr) (void)cudaStreamSynchronize(stage_stream);
}

bool CopyEngine::Core::StagingLocked() {
  if (staging_tried) return staging != nullptr;
  staging_tried = true;
  if (mapped_ring == nullptr) return false;  // the staged kernels read their descriptors there
  // Made whole or not at all: a partial set is released here and never used.
  bool ok = cudaStreamCreateWithFlags(&stage_stream, cudaStreamNonBlocking) == cudaSuccess;
  for (int i = 0; ok && i < kStageSlots; ++i)
    ok = cudaEventCreateWithFlags(&stage_handoff[i], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&stage_free[i], cudaEventDisableTiming) == cudaSuccess;
  void* buffer = nullptr;
  ok = ok && cudaMalloc(&buffer, kStageSlots * kStageSlotBytes) == cudaSuccess;
  if (ok) {
    staging = static_cast<std::byte*>(buffer);
    return true;
  }
  (void)cudaGetLastError();
  for (int i = 0; i < kStageSlots; ++i) {
    if (stage_handoff[i] != nullptr) (void)cudaEventDestroy(stage_handoff[i]);
    if (stage_free[i] != nullptr) (void)cudaEventDestroy(stage_free[i]);
    stage_handoff[i] = stage_free[i] = nullptr;
  }
  if (stage_stream != nullptr) (void)cudaStreamDestroy(stage_stream);
  stage_stream = nullptr;
  return false;
}

Status CopyEngine::Core::PushSegmentLocked(cudaStream_t on, bool uses_ring, size_t ring_end,
                                           std::shared_ptr<Completion> completion, Status error) {
  cudaEvent_t event = nullptr;
  if (!free_events.empty()) {
    event = free_events.back();
    free_events.pop_back();
  } else {
    // Blocking sync: the completer thread sleeps in cudaEventSynchronize instead of spinning.
    FERRY_RETURN_IF_ERROR(ToStatus(
        cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming),
        "cudaEventCreateWithFlags"));
  }
  Status recorded = ToStatus(cudaEventRecord(event, on), "cudaEventRecord");
  if (!recorded.ok()) {
    free_events.push_back(event);
    return recorded;
  }
  if (uses_ring) ++ring_users;
  in_flight.push_back(Segment{event, uses_ring, ring_end, std::move(completion), std::move(error)});
  return Status::Ok();
}

void CopyEngine::Core::ReapLocked(Done* done, const Status* force) {
  while (!in_flight.empty()) {
    Segment& s = in_flight.front();
    Status status;
    if (force != nullptr) {
      status = *force;
    } else {
      cudaError_t e = cudaEventQuery(s.event);
      if (e == cudaErrorNotReady) break;
      status = ToStatus(e, "CUDA copies on device " + std::to_string(device));
    }
    if (s.uses_ring) {
      tail = s.ring_end;
      --ring_users;
    }
    ReleaseEventLocked(s.event);
    if (s.completion) done->emplace_back(std::move(s.completion), s.error.ok() ? status : s.error);
    in_flight.pop_front();
  }
}

void CopyEngine::Core::Poll() {
  Done done;
  {
    // Another thread reaping already does this caller's work.
    if (!mu.TryLock()) return;
    ReapLocked(&done, nullptr);
    mu.Unlock();
  }
  RunDone(done);
}

void CopyEngine::Core::CompleterLoop() {
  mu.Lock();
  for (;;) {
    cv.Wait(&mu, [this]() REQUIRES(mu) { return stop || !in_flight.empty(); });
    if (in_flight.empty()) break;  // stopped, and every batch completed
    cudaEvent_t event = in_flight.front().event;
    completer_event = event;
    mu.Unlock();
    cudaError_t waited = cudaEventSynchronize(event);
    mu.Lock();
    completer_event = nullptr;
    if (completer_event_released) {
      completer_event_released = false;
      free_events.push_back(event);
    }
    Done done;
    ReapLocked(&done, nullptr);
    if (waited != cudaSuccess && !in_flight.empty() && in_flight.front().event == event) {
      // The wait failed but the event never completes (e.g. the runtime is unloading): fail
      // what is in flight rather than spin.
      Status failed = ToStatus(waited, "waiting for CUDA copies on device " + std::to_string(device));
      ReapLocked(&done, &failed);
    }
    mu.Unlock();
    RunDone(done);
    mu.Lock();
  }
  mu.Unlock();
}

// CopyEngine: the handle.

CopyEngine::CopyEngine(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Result<std::unique_ptr<CopyEngine>> CopyEngine::Create(int device) {
  auto core = std::make_shared<Core>();
  FERRY_RETURN_IF_ERROR(core->Init(device));
  std::unique_ptr<CopyEngine> engine(new CopyEngine(core));
  try {
    engine->completer_ = std::thread([core] { core->CompleterLoop(); });
  } catch (const std::system_error& e) {
    // ~CopyEngine finds no thread to join and releases the stream and its buffers.
    return Status(Code::kResourceExhausted, "cannot start the CUDA copy completion thread of device " +
                                                std::to_string(device) + ": " + e.what());
  }
  return engine;
}

CopyEngine::~CopyEngine() {
  {
    MutexLock lock(&core_->mu);
    core_->stop = true;
  }
  core_->cv.NotifyAll();
  // A callback run by the completer may drop the last owner of this engine: the completer
  // then finishes on its own and frees the shared state when it ends.
  if (completer_.get_id() == std::this_thread::get_id()) {
    completer_.detach();
  } else if (completer_.joinable()) {
    completer_.join();
  }
}

void CopyEngine::Poll() { core_->Poll(); }

std::function<void()> CopyEngine::Poller() const {
  return [weak = std::weak_ptr<Core>(core_)] {
    if (auto core = weak.lock()) core->Poll();
  };
}

int CopyEngine::device() const { return core_->device; }

CopyStats CopyEngine::stats() const {
  MutexLock lock(&core_->mu);
  return core_->stats;
}

// Completion.

bool Completion::Test() {
  if (done_.load(std::memory_order_acquire)) return true;
  if (auto engine = engine_.lock()) engine->Poll();
  return done_.load(std::memory_order_acquire);
}

Status Completion::status() const {
  if (!done_.load(std::memory_order_acquire)) return Status(Code::kInProgress, "CUDA copies still running");
  MutexLock lock(&mu_);
  return status_;
}

void Completion::Finish(const Status& status) {
  // The batch's op buffer may serve the next one: given back before anyone sees the batch done,
  // so that a caller who waited for it finds the buffer free.
  hold_.reset();
  {
    MutexLock lock(&mu_);
    status_ = status;
  }
  done_.store(true, std::memory_order_release);
  auto on_done = std::move(on_done_);
  on_done_ = nullptr;
  if (on_done) on_done(status);
}

// Peer access and mapped host memory.

Status EnablePeerAccess(int device, int peer) {
  if (device == peer) return Status::Ok();
  static Mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, Status>();  // never destroyed; under mu
  MutexLock lock(&mu);
  auto it = cache->find({device, peer});
  if (it != cache->end()) return it->second;
  Status result = [&]() -> Status {
    DeviceGuard guard(device);
    FERRY_RETURN_IF_ERROR(guard.status());
    int can = 0;
    FERRY_RETURN_IF_ERROR(ToStatus(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer"));
    if (!can)
      return Status(Code::kUnsupported, "CUDA device " + std::to_string(device) + " cannot access device " +
                                            std::to_string(peer) + " directly");
    Status s = ToStatus(cudaDeviceEnablePeerAccess(peer, 0), "cudaDeviceEnablePeerAccess");
    return s.code() == Code::kAlreadyExists ? Status::Ok() : s;  // enabled by someone else
  }();
  cache->emplace(std::make_pair(device, peer), result);
  return result;
}

bool IsMappedHost(const void* ptr, int device) {
  DeviceGuard guard(device);
  if (!guard.status().ok()) return false;
  // Page-locked memory (cudaHostAlloc or cudaHostRegister) has host flags; pageable memory has
  // none, even where the driver reports it as host memory the device can address (HMM), and a
  // kernel must not read it.
  unsigned int flags = 0;
  if (cudaHostGetFlags(&flags, const_cast<void*>(ptr)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost && attr.devicePointer == ptr;
}

CopyEngines::CopyEngines()
    : devices_(std::max(0, DeviceCount())), engines_(static_cast<size_t>(devices_)) {}

CopyStats CopyEngines::stats() {
  MutexLock lock(&mu_);
  CopyStats sum;
  for (const auto& e : engines_) {
    if (!e) continue;
    CopyStats s = e->stats();
    sum.batches += s.batches;
    sum.kernel_launches += s.kernel_launches;
    sum.kernel_pieces += s.kernel_pieces;
    sum.direct_batches += s.direct_batches;
    sum.dma_calls += s.dma_calls;
    sum.dma_copies += s.dma_copies;
    sum.staged_chunks += s.staged_chunks;
    sum.staged_bytes += s.staged_bytes;
    sum.strided_runs += s.strided_runs;
  }
  return sum;
}

Result<CopyEngine*> CopyEngines::For(int device) {
  if (device < 0 || device >= devices_)
    return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device));
  MutexLock lock(&mu_);
  auto& slot = engines_[device];
  if (!slot) {
    FERRY_ASSIGN_OR_RETURN(slot, CopyEngine::Create(device));
  }
  return slot.get();
}

}  // namespace ferry::cuda
