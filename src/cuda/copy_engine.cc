#include "cuda/copy_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "cuda/copy_kernels.h"
#include "cuda/cuda_status.h"
#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {

// Pieces this large go to the DMA engines even when a kernel could copy them: one DMA engine
// fills the link on such a piece, and the SMs stay free for the model.
constexpr uint64_t kLargePieceBytes = 1 << 20;
// Batches of this many pieces or fewer go to the DMA engines: a descriptor upload and a launch
// cost more than a few cudaMemcpyAsync calls.
constexpr size_t kFewPieces = 4;
// Descriptor ring, in pieces (24 bytes each), page-locked on the host and mirrored on the
// device; one launch takes at most a quarter of it so that batches overlap.
constexpr size_t kRingPieces = size_t{1} << 17;
constexpr size_t kMaxLaunchPieces = kRingPieces / 4;
// The first launch of a batch carries at most this many pieces and each later one twice the
// last, so that the GPU starts while the CPU still fills descriptors for the rest: on an H200 a
// first launch of 32,768 pieces kept the link idle for about 1.4 ms of a 27 ms batch.
constexpr size_t kFirstLaunchPieces = 2048;

// Walks a batch (a span of Copy or an OffsetBatch) once: cuts the kernel's copies into pieces
// of at most kMaxPieceBytes as launches ask for them, and sets aside the copies that go to the
// DMA engines (those of kLargePieceBytes or more, or all when the batch goes there whole).
template <typename Source>
struct PieceCursor {
  const Source& copies;
  bool all_dma;
  std::vector<Copy>* dma;
  size_t index = 0;     // copy being cut
  uint64_t offset = 0;  // bytes of it already handed out

  bool done() const { return index == copies.size(); }

  // Fills up to n pieces; returns how many.
  size_t Fill(Piece* out, size_t n) {
    size_t k = 0;
    while (k < n && index < copies.size()) {
      const Copy c = copies[index];
      if (c.size == 0) {
        ++index;
        continue;
      }
      if (all_dma || c.size >= kLargePieceBytes) {
        dma->push_back(c);
        ++index;
        continue;
      }
      const uint64_t len = std::min(kMaxPieceBytes, c.size - offset);
      out[k++] = Piece{reinterpret_cast<uint64_t>(c.dst) + offset, reinterpret_cast<uint64_t>(c.src) + offset, len};
      offset += len;
      if (offset == c.size) {
        ++index;
        offset = 0;
      }
    }
    return k;
  }
};

}  // namespace

// The engine's state, shared by the handle, its completer thread and running pollers, so that
// it lives until the last of them lets go.
struct CopyEngine::Core {
  // A span of stream work that ends with an event, in stream order.
  struct Segment {
    cudaEvent_t event = nullptr;
    bool uses_ring = false;
    size_t ring_end = 0;                     // ring index after this segment's descriptors
    std::shared_ptr<Completion> completion;  // set on the last segment of a batch
    Status error;                            // an enqueue error of that batch
  };
  using Done = std::vector<std::pair<std::shared_ptr<Completion>, Status>>;

  ~Core();
  Status Init(int ordinal);
  // Source: std::span<const Copy> or OffsetBatch (size() and operator[] giving a Copy).
  template <typename Source>
  Result<std::shared_ptr<Completion>> Post(const std::shared_ptr<Core>& self, const Source& copies,
                                           PostOptions options);
  void Poll();
  void CompleterLoop();

  // REQUIRES (every *Locked method): mu held.
  Status EnqueueDmaLocked(const std::vector<Copy>& dma, bool batched, bool* enqueued);
  Status PushSegmentLocked(bool uses_ring, size_t ring_end, std::shared_ptr<Completion> completion,
                           Status error);
  bool AllocRingLocked(size_t n, size_t* at);
  void ReleaseEventLocked(cudaEvent_t event);
  void ReapLocked(Done* done, const Status* force);
  static void RunDone(Done& done) {
    for (auto& [completion, status] : done) completion->Finish(status);
  }

  int device = 0;
  uint32_t max_blocks = 0;
  cudaStream_t stream = nullptr;
  Piece* host_ring = nullptr;
  Piece* device_ring = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Segment> in_flight;          // GUARDED_BY(mu)
  std::vector<cudaEvent_t> free_events;   // GUARDED_BY(mu)
  size_t head = 0, tail = 0;              // GUARDED_BY(mu): ring [tail, head) in use, may wrap
  size_t ring_users = 0;                  // GUARDED_BY(mu): segments in flight that use the ring
  cudaEvent_t completer_event = nullptr;  // GUARDED_BY(mu): the event the completer sleeps on
  bool completer_event_released = false;  // GUARDED_BY(mu): its segment was reaped meanwhile
  bool stop = false;                      // GUARDED_BY(mu)
};

CopyEngine::Core::~Core() {
  DeviceGuard guard(device);
  if (stream != nullptr) (void)cudaStreamSynchronize(stream);
  for (cudaEvent_t e : free_events) (void)cudaEventDestroy(e);
  if (host_ring != nullptr) (void)cudaFreeHost(host_ring);
  if (device_ring != nullptr) (void)cudaFree(device_ring);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
}

Status CopyEngine::Core::Init(int ordinal) {
  device = ordinal;
  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  int sms = 0;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                                 "cudaDeviceGetAttribute"));
  // One block per SM; the kernel's grid-stride loop covers larger batches. Measured on an H200
  // (bench/results/copy_sweep_h200.md): as fast as or 1-2% faster than 2, 4 or 8 blocks per SM
  // on every path (device, pinned host both ways) at 16, 32 and 128 KiB pieces.
  max_blocks = static_cast<uint32_t>(std::max(sms, 1));
  FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags"));
  const size_t ring_bytes = kRingPieces * sizeof(Piece);
  FERRY_RETURN_IF_ERROR(ToStatus(cudaHostAlloc(reinterpret_cast<void**>(&host_ring), ring_bytes,
                                               cudaHostAllocPortable),
                                 "cudaHostAlloc (descriptor ring)"));
  return ToStatus(cudaMalloc(reinterpret_cast<void**>(&device_ring), ring_bytes),
                  "cudaMalloc (descriptor ring)");
}

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

Status CopyEngine::Core::PushSegmentLocked(bool uses_ring, size_t ring_end,
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
  Status recorded = ToStatus(cudaEventRecord(event, stream), "cudaEventRecord");
  if (!recorded.ok()) {
    free_events.push_back(event);
    return recorded;
  }
  if (uses_ring) ++ring_users;
  in_flight.push_back(Segment{event, uses_ring, ring_end, std::move(completion), std::move(error)});
  return Status::Ok();
}

Status CopyEngine::Core::EnqueueDmaLocked(const std::vector<Copy>& dma, bool batched,
                                          bool* enqueued) {
#if CUDART_VERSION >= 12080
  if (batched && dma.size() > 1) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(dma.size());
    srcs.reserve(dma.size());
    sizes.reserve(dma.size());
    for (const Copy& c : dma) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.size);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;  // copy engines, not SMs
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    cudaError_t error = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dma.size(),
                                             &attr, &attr_index, 1, stream);
#else
    size_t fail_index = SIZE_MAX;
    cudaError_t error = cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()),
                                             sizes.data(), dma.size(), &attr, &attr_index, 1,
                                             &fail_index, stream);
#endif
    if (error == cudaSuccess) {
      *enqueued = true;
      return Status::Ok();
    }
    (void)cudaGetLastError();  // e.g. a driver without batch copies: one call per piece
  }
#endif
  for (const Copy& c : dma) {
    FERRY_RETURN_IF_ERROR(
        ToStatus(cudaMemcpyAsync(c.dst, c.src, c.size, cudaMemcpyDefault, stream), "cudaMemcpyAsync"));
    *enqueued = true;
  }
  return Status::Ok();
}

template <typename Source>
Result<std::shared_ptr<Completion>> CopyEngine::Core::Post(const std::shared_ptr<Core>& self,
                                                           const Source& copies, PostOptions options) {
  // One pass over the batch: the kernel's pieces are cut into the ring launch by launch (the
  // GPU starts on the first while the rest are cut), large pieces (or all, see above) are set
  // aside for the DMA engines, which are enqueued after the last launch.
  const bool all_dma = !options.kernel_ok || copies.size() <= kFewPieces;
  std::vector<Copy> dma;
  PieceCursor<Source> cursor{copies, all_dma, &dma};
  auto completion = std::make_shared<Completion>();
  completion->engine_ = self;
  completion->on_done_ = std::move(options.on_done);

  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  Done done;
  std::unique_lock<std::mutex> lock(mu);
  bool enqueued = false;
  bool placed = false;  // the completion sits on a segment already
  Status error;
  if (all_dma) {
    dma.reserve(copies.size());
    for (size_t i = 0; i < copies.size(); ++i)
      if (const Copy c = copies[i]; c.size != 0) dma.push_back(c);
  }
  auto backoff = std::chrono::microseconds(5);
  size_t launch = kFirstLaunchPieces;
  while (error.ok() && !all_dma && !cursor.done()) {
    const size_t prev_head = head;
    size_t at = 0;
    if (!AllocRingLocked(launch, &at)) {
      // The ring is full of batches in flight: complete what has finished, then back off.
      if (options.deadline.expired()) {
        error = Status(Code::kResourceExhausted, "CUDA copy descriptor ring stayed full until the deadline");
        break;
      }
      ReapLocked(&done, nullptr);
      lock.unlock();
      RunDone(done);
      done.clear();
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(500));
      lock.lock();
      continue;
    }
    // Straight into the page-locked ring: no copy in between.
    const size_t n = cursor.Fill(host_ring + at, launch);
    if (n == 0) {  // the rest of the batch goes to the DMA engines
      head = prev_head;
      break;
    }
    head = at + n;  // hand back what this launch did not fill (the newest allocation)
    error = ToStatus(cudaMemcpyAsync(device_ring + at, host_ring + at, n * sizeof(Piece),
                                     cudaMemcpyHostToDevice, stream),
                     "upload copy descriptors");
    if (error.ok()) {
      enqueued = true;
      error = ToStatus(static_cast<cudaError_t>(LaunchBatchCopy(device_ring + at, static_cast<uint32_t>(n),
                                                                max_blocks, stream)),
                       "launch batch copy kernel");
    }
    launch = std::min(launch * 2, kMaxLaunchPieces);
    const bool last = (cursor.done() && dma.empty()) || !error.ok();
    Status pushed = PushSegmentLocked(true, at + n, last ? completion : nullptr, error);
    if (!pushed.ok()) {
      // Without an event the ring space cannot be tracked: wait here instead.
      (void)cudaStreamSynchronize(stream);
      if (error.ok()) error = pushed;
      break;
    }
    placed = last;
  }
  if (error.ok() && !dma.empty()) error = EnqueueDmaLocked(dma, /*batched=*/!options.pageable, &enqueued);
  if (!placed) {
    if (!enqueued) {
      if (!error.ok()) return error;  // nothing moves: the caller learns it from Post
      done.push_back({completion, Status::Ok()});  // nothing to copy
    } else {
      Status pushed = PushSegmentLocked(false, 0, completion, error);
      if (!pushed.ok()) {
        (void)cudaStreamSynchronize(stream);
        done.push_back({completion, error.ok() ? pushed : error});
      }
    }
  }
  lock.unlock();
  cv.notify_one();
  RunDone(done);
  return completion;
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
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    ReapLocked(&done, nullptr);
  }
  RunDone(done);
}

void CopyEngine::Core::CompleterLoop() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait(lock, [this] { return stop || !in_flight.empty(); });
    if (in_flight.empty()) return;  // stopped, and every batch completed
    cudaEvent_t event = in_flight.front().event;
    completer_event = event;
    lock.unlock();
    cudaError_t waited = cudaEventSynchronize(event);
    lock.lock();
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
    lock.unlock();
    RunDone(done);
    lock.lock();
  }
}

// CopyEngine: the handle.

CopyEngine::CopyEngine(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Result<std::unique_ptr<CopyEngine>> CopyEngine::Create(int device) {
  auto core = std::make_shared<Core>();
  FERRY_RETURN_IF_ERROR(core->Init(device));
  std::unique_ptr<CopyEngine> engine(new CopyEngine(core));
  engine->completer_ = std::thread([core] { core->CompleterLoop(); });
  return engine;
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stop = true;
  }
  core_->cv.notify_all();
  // A callback run by the completer may drop the last owner of this engine: the completer
  // then finishes on its own and frees the shared state when it ends.
  if (completer_.get_id() == std::this_thread::get_id()) {
    completer_.detach();
  } else if (completer_.joinable()) {
    completer_.join();
  }
}

Result<std::shared_ptr<Completion>> CopyEngine::Post(const OffsetBatch& batch, PostOptions options) {
  return core_->Post(core_, batch, std::move(options));
}

Result<std::shared_ptr<Completion>> CopyEngine::Post(std::span<const Copy> copies, PostOptions options) {
  return core_->Post(core_, copies, std::move(options));
}

void CopyEngine::Poll() { core_->Poll(); }

std::function<void()> CopyEngine::Poller() const {
  return [weak = std::weak_ptr<Core>(core_)] {
    if (auto core = weak.lock()) core->Poll();
  };
}

int CopyEngine::device() const { return core_->device; }

// Completion.

bool Completion::Test() {
  if (done_.load(std::memory_order_acquire)) return true;
  if (auto engine = engine_.lock()) engine->Poll();
  return done_.load(std::memory_order_acquire);
}

Status Completion::status() const {
  if (!done_.load(std::memory_order_acquire)) return Status(Code::kInProgress, "CUDA copies still running");
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void Completion::Finish(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, Status>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
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

CopyEngines::CopyEngines() : engines_(static_cast<size_t>(std::max(0, DeviceCount()))) {}

Result<CopyEngine*> CopyEngines::For(int device) {
  if (device < 0 || device >= static_cast<int>(engines_.size()))
    return Status(Code::kInvalidArgument, "no CUDA device " + std::to_string(device));
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = engines_[device];
  if (!slot) {
    FERRY_ASSIGN_OR_RETURN(slot, CopyEngine::Create(device));
  }
  return slot.get();
}

}  // namespace ferry::cuda
