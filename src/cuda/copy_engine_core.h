// The copy engine's shared state, internal to copy_engine.cc (which tracks batches to their
// completion), copy_post.cc (which cuts batches into launches) and copy_enqueue.cc (the DMA
// engines' share). See copy_engine.h.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "cuda/copy_engine.h"
#include "cuda/copy_kernels.h"

namespace ferry::cuda {

// Descriptor ring, in pieces (24 bytes each), page-locked on the host and mirrored on the
// device.
inline constexpr size_t kRingPieces = size_t{1} << 17;
// A staging slot holds one chunk placed at its host address mod kStageAlign, so that the DMA
// engine's two sides share their alignment (slots are kStageAlign-aligned).
inline constexpr uint64_t kStageAlign = 64 << 10;
inline constexpr uint64_t kStageSlotBytes = kStageChunkBytes + kStageAlign;

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
                                           PostOptions options) EXCLUDES(mu);
  std::optional<OpBuffer> ReserveOps(const std::shared_ptr<Core>& self, size_t n) EXCLUDES(mu);
  void Poll() EXCLUDES(mu);
  void CompleterLoop() EXCLUDES(mu);

  // REQUIRES (every *Locked method): mu held.
  Status EnqueueDmaLocked(const std::vector<Copy>& dma, bool batched, bool* enqueued) REQUIRES(mu);
  // Records the segment's event on `on` (the stream of the segment's work).
  Status PushSegmentLocked(cudaStream_t on, bool uses_ring, size_t ring_end,
                           std::shared_ptr<Completion> completion, Status error) REQUIRES(mu);
  // The stream of the next launch: the two launch streams in turn.
  cudaStream_t NextLaunchStreamLocked() REQUIRES(mu) { return (launches++ & 1) ? stream2 : stream; }
  // Waits for both launch streams (an enqueue failed and the ring cannot be tracked).
  void SyncStreams();
  bool AllocRingLocked(size_t n, size_t* at) REQUIRES(mu);
  // Makes the staging buffer, its stream and events on first use; false when they cannot be
  // made (the batch's runs then go through the kernel like any other pieces; tried once).
  bool StagingLocked() REQUIRES(mu);
  // Enqueues one chunk of a host-contiguous run: `n` ops already in the host ring at `at`, `bytes` long, starting at `host_start` on the host side. Sets *on to
  // the stream whose work ends the chunk.
  Status EnqueueStagedLocked(const OffsetBatch& batch, bool host_is_dst, size_t at, size_t n, uint64_t bytes,
                             uint64_t host_start, cudaStream_t* on) REQUIRES(mu);
  // Enqueues a strided run on stage_stream as one 2D copy: `count` ops of `size` bytes from
  // `first`, each `local_stride` / `remote_stride` after the last on the two sides.
  Status EnqueueStridedLocked(const OffsetBatch& batch, const TransferOp& first, size_t count, uint64_t local_stride,
                              uint64_t remote_stride) REQUIRES(mu);
  // Uploads n descriptors from `host` to `dev` on the upload stream, then launches the copy
  // kernel over them on the next launch stream (*on) with a grid of at most `blocks`, as ops of
  // `offsets` or, when null, as pieces. Sets *enqueued once the launch is enqueued.
  Status UploadAndLaunchLocked(const Piece* host, Piece* dev, size_t n, const OffsetBatch* offsets, uint32_t blocks,
                               cudaStream_t* on, bool* enqueued) REQUIRES(mu);
  void ReleaseEventLocked(cudaEvent_t event) REQUIRES(mu);
  void ReapLocked(Done* done, const Status* force) REQUIRES(mu);
  static void RunDone(Done& done) {
    for (auto& [completion, status] : done) completion->Finish(status);
  }

  int device = 0;
  uint32_t max_blocks = 0;   // a launch's grid between GPU memory
  uint32_t host_blocks = 0;  // with pinned host memory on a side (PostOptions::host_side)
  // Launches alternate between two streams, so that a launch starts while the one before it
  // drains its last pieces (on one stream each launch waited for the previous one's tail).
  // Copies to the DMA engines go on `stream`. Every launch is a segment with its own event, and
  // segments complete in the order pushed (ReapLocked), so a batch's last event completes it
  // only once every earlier launch, on either stream, has completed: no join is needed.
  cudaStream_t stream = nullptr;
  cudaStream_t stream2 = nullptr;
  // Descriptor uploads, and the event each launch waits for on its stream (recorded again for
  // every upload: a wait takes the record that was current when it was enqueued).
  cudaStream_t upload_stream = nullptr;
  cudaEvent_t upload_event = nullptr;
  Piece* host_ring = nullptr;
  Piece* device_ring = nullptr;
  // The host ring as kernels address it (it is mapped): a staged chunk's kernel reads its
  // descriptors from there, so that no descriptor upload queues on a DMA engine behind the
  // chunks' own copies.
  Piece* mapped_ring = nullptr;
  // Device staging for host-contiguous runs (PostOptions::host_side), made on first use:
  // kStageSlots slots of kStageChunkBytes used in turn. The DMA engines' side of a chunk goes on
  // stage_stream; stage_handoff[s] marks slot s's chunk gathered (to host) or landed (from
  // host), stage_free[s] that the slot may be written again. Waits take the record current when
  // they are enqueued, and every enqueue happens under mu, so re-recording is safe.
  std::byte* staging = nullptr;
  cudaStream_t stage_stream = nullptr;
  cudaEvent_t stage_handoff[kStageSlots] = {};
  cudaEvent_t stage_free[kStageSlots] = {};

  // The op buffers (ReserveOps): page-locked, mapped host storage, made on first use each;
  // `busy` while a handle or a batch holds one.
  struct OpSlot {
    TransferOp* host = nullptr;
    void* mapped = nullptr;  // its device address
    bool busy = false;
  };

  Mutex mu;
  CondVar cv;
  OpSlot op_slots[kOpBuffers] GUARDED_BY(mu);
  bool op_slots_failed GUARDED_BY(mu) = false;  // their memory could not be had: not tried again
  std::deque<Segment> in_flight GUARDED_BY(mu);
  std::vector<cudaEvent_t> free_events GUARDED_BY(mu);
  size_t head GUARDED_BY(mu) = 0;  // ring [tail, head) in use, may wrap
  size_t tail GUARDED_BY(mu) = 0;
  size_t ring_users GUARDED_BY(mu) = 0;                  // segments in flight that use the ring
  uint64_t launches GUARDED_BY(mu) = 0;                  // kernel launches so far (picks the stream)
  uint64_t staged GUARDED_BY(mu) = 0;                    // staged chunks so far (picks the slot)
  bool staging_tried GUARDED_BY(mu) = false;             // StagingLocked ran once
  cudaEvent_t completer_event GUARDED_BY(mu) = nullptr;  // the event the completer sleeps on
  bool completer_event_released GUARDED_BY(mu) = false;  // its segment was reaped meanwhile
  bool stop GUARDED_BY(mu) = false;
  CopyStats stats GUARDED_BY(mu);
};

}  // namespace ferry::cuda
