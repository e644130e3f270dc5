// CopyEngine: moves batches of copies on one CUDA device without blocking the caller.
//
// Each engine owns two non-blocking launch streams (kernel launches alternate between them; DMA
// copies go on the first), a ring of piece descriptors (page-locked on the host, mirrored on
// the device) and a pool of events. Post() enqueues a batch and returns at once: many small
// pieces become a few kernel launches; a few large pieces, or memory that kernels cannot
// address (pageable host memory), go to the DMA engines (cudaMemcpyBatchAsync /
// cudaMemcpyAsync). Runs of pieces that lie end to end in page-locked host memory while
// scattered on the device (PostOptions::host_side) go through a staging buffer in device memory:
// the SMs gather (or scatter) a chunk there and a DMA engine moves it in one copy, on a stream
// of its own, chunks pipelined over three slots. Completion is observed by cudaEventQuery from
// Poll() (never blocks) and by the engine's completion thread, which sleeps on the oldest
// event, so that a batch nobody polls (its transfer already timed out, say) still completes
// and releases what it holds.
//
// Thread safety: every method may be called from any thread. Callbacks run on the thread that
// observes completion, with no lock of the engine held; they may Post() again.
//
// Invariant of Completion::done_ (read without a lock): it goes false -> true once, after the
// batch's status was stored under the completion's mutex (release / acquire), and on_done runs
// once, on the thread that finished the batch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/types.h"
#include "ferry/status.h"

namespace ferry::cuda {

struct Copy {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t size = 0;
};

// A batch given as offsets into one destination and one source buffer, read straight from the
// caller's ops: no array of copies is built for it. Op i moves ops[i].size bytes from
// src + (its source offset) to dst + (its destination offset); a write's destination is the
// remote side.
// Page-locked, mapped storage for one batch's ops, from CopyEngine::ReserveOps. The caller
// copies and checks a batch into it and posts it (OffsetBatch::buffer): the engine then launches
// one kernel that reads the ops where they lie, over PCIe. Without it the posting thread copies
// each op again into the engine's descriptor ring (on an H200 machine's host that second pass
// took about 4 ns an op, half what the GPU takes to copy a 16 KiB op, and the GPU waited for
// it). The storage returns to the engine once the last copy of `hold` is gone: the caller's,
// and that of the batch posted from it until the batch completes.
struct OpBuffer {
  TransferOp* ops = nullptr;
  size_t capacity = 0;  // ops
  // Every op in the buffer is at most this long, as the caller's check found (UINT64_MAX: not
  // known; the engine then reads the ops as it reads any batch's).
  uint64_t max_op_size = UINT64_MAX;
  const void* mapped_ops = nullptr;  // `ops` as the engine's kernels address them
  const void* owner = nullptr;  // the engine that made it
  std::shared_ptr<void> hold;
};

struct OffsetBatch {
  std::span<const TransferOp> ops;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  bool write = true;  // destination offsets are remote_offset, source offsets local_offset
  // When `ops` lie at the start of this buffer (the engine's own, from ReserveOps).
  const OpBuffer* buffer = nullptr;

  size_t size() const { return ops.size(); }
  Copy operator[](size_t i) const {
    const TransferOp& o = ops[i];
    return Copy{dst + (write ? o.remote_offset : o.local_offset),
                src + (write ? o.local_offset : o.remote_offset), o.size};
  }
};

struct PostOptions {
  // Every dst and src is addressable by kernels on the engine's device: its own memory, peer
  // memory with peer access enabled, or mapped page-locked host memory. When false only the
  // DMA engines touch the memory.
  bool kernel_ok = false;
  // Some side is pageable host memory: the DMA copies go one cudaMemcpyAsync per piece (the
  // batched copy call failed on pageable memory in testing on an H200 with driver 580).
  bool pageable = false;
  // Pieces of 1 MiB and more go to the DMA engines (one fills PCIe or NVLink on such a piece,
  // and leaves the SMs to the model). False when both sides are the engine's own device memory:
  // within one GPU's memory its SMs copy about 4x faster than a DMA engine (on an H200, merged
  // 2 MiB pieces: 1.57 TB/s through the kernel against 0.35 TB/s, bench/results/cuda_ipc.md).
  bool large_to_dma = true;
  // Which side of the batch is page-locked host memory, where the other is the engine's device
  // (kNone: neither, or not known). On a batch of offsets, where that side's pieces lie end to
  // end in runs of kStageMinBytes or more while the device side's are scattered (a request's
  // blocks offloaded into one host slab, or loaded back from it), the SMs gather the device
  // side into a staging buffer in device memory (or scatter it from there) and a DMA engine
  // moves each chunk of the run in one copy, the two pipelined; runs at a fixed stride on both
  // sides go to a DMA engine as one 2D copy. Per-piece copies over PCIe by either the SMs or the
  // DMA engines stay below a bulk copy's rate (bench/results/cuda_ipc.md).
  enum class HostSide : uint8_t { kNone, kDst, kSrc };
  HostSide host_side = HostSide::kNone;
  // Called exactly once, when every copy of the batch is done or failed.
  std::function<void(const Status&)> on_done;
  // How long Post() may wait for descriptor space when many batches are in flight.
  Deadline deadline = Deadline::After(std::chrono::seconds(30));
};

class Completion;

// What an engine has enqueued since it was made: how a batch of pieces became GPU work.
struct CopyStats {
  uint64_t batches = 0;          // Post() calls that enqueued work
  uint64_t kernel_launches = 0;  // copy kernel launches (each with one descriptor upload)
  uint64_t kernel_pieces = 0;    // pieces those launches copied
  uint64_t dma_calls = 0;        // cudaMemcpyBatchAsync / cudaMemcpyAsync calls
  uint64_t dma_copies = 0;       // copies those calls carried
  uint64_t staged_chunks = 0;    // chunks of host-contiguous runs moved through device staging
  uint64_t staged_bytes = 0;     // bytes of those chunks
  uint64_t strided_runs = 0;     // runs of equally strided pieces moved by one 2D DMA copy each
  uint64_t direct_batches = 0;   // batches launched from their OpBuffer as they lie
};

// Runs of host-contiguous pieces this long, or longer, go through device staging
// (PostOptions::host_side); each chunk of a run is at most kStageChunkBytes, and kStageSlots
// chunks are in flight at once (the staging buffer, made on a device's first staged chunk, is
// kStageSlots * kStageChunkBytes of device memory). Runs of at least kStrideMinOps pieces of
// one size, each a fixed distance after the last on both sides (a regular layout), and of
// kStageMinBytes or more, go to a DMA engine as one 2D copy instead, with no staging.
inline constexpr uint64_t kStageMinBytes = 4 << 20;
inline constexpr uint64_t kStageChunkBytes = 16 << 20;
inline constexpr int kStageSlots = 3;
inline constexpr size_t kStrideMinOps = 16;
// An engine's op buffers (ReserveOps): how many, and the ops each holds.
inline constexpr int kOpBuffers = 4;
inline constexpr size_t kOpBufferOps = size_t{1} << 17;

// Adds `s` to the gpu_* counters of `out`.
inline void AddTo(const CopyStats& s, EngineStats* out) {
  out->gpu_kernel_launches += s.kernel_launches;
  out->gpu_kernel_pieces += s.kernel_pieces;
  out->gpu_dma_calls += s.dma_calls;
  out->gpu_dma_copies += s.dma_copies;
}

class CopyEngine {
 public:
  // REQUIRES: cuda::Available() and 0 <= device < cuda::DeviceCount().
  static Result<std::unique_ptr<CopyEngine>> Create(int device);
  // Waits for the batches in flight (their callbacks run), then frees the stream and buffers.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueues `copies` (none empty, none overlapping another's destination). Returns an error,
  // having enqueued nothing and without calling on_done, when nothing could be enqueued; once
  // anything is enqueued, later failures are reported through the completion.
  Result<std::shared_ptr<Completion>> Post(std::span<const Copy> copies, PostOptions options);
  // The same for a batch of offsets (empty ops are skipped). The GPU starts on the first
  // pieces while the rest are still being cut.
  Result<std::shared_ptr<Completion>> Post(const OffsetBatch& batch, PostOptions options);
  // An op buffer for a batch of `n` ops (see OpBuffer); none when n is over kOpBufferOps, when
  // all kOpBuffers are in use, or when the memory cannot be had (the caller then posts from
  // its own storage, as always).
  std::optional<OpBuffer> ReserveOps(size_t n);
  // Completes every finished batch (runs their callbacks). Never blocks on the GPU.
  void Poll();
  // A function that polls this engine while it lives (for TransferState::SetPoller); holds no
  // strong reference, so it may outlive the engine.
  std::function<void()> Poller() const;
  int device() const;
  CopyStats stats() const;

 private:
  friend class Completion;
  struct Core;
  explicit CopyEngine(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
  std::thread completer_;
};

// The completion of one posted batch.
class Completion {
 public:
  // True once the batch is done; polls the engine, never blocks.
  bool Test();
  // kInProgress until done, then the batch's status.
  Status status() const;

 private:
  friend struct CopyEngine::Core;
  // Publishes the status, then runs on_done_ (once).
  void Finish(const Status& status);

  std::weak_ptr<CopyEngine::Core> engine_;
  std::function<void(const Status&)> on_done_;
  std::shared_ptr<void> hold_;  // the batch's OpBuffer, until it is done
  std::atomic<bool> done_{false};
  mutable Mutex mu_;
  Status status_ GUARDED_BY(mu_);  // valid once done_
};

// One CopyEngine per device of this process, each made on first use (a stream on a device
// initialises its context: time and memory), so a set costs nothing until a GPU copy is
// posted. An engine makes one set and shares it with every transport that copies with CUDA
// (TransportContext::copy_engines): one stream and completion thread per device per engine,
// and one place for the engine's GPU copy statistics. Thread-safe; engines live as long as the
// set, and its last holder waits for their batches in flight. Builds without CUDA have a set of
// no devices (copy_engine_none.cc).
class CopyEngines {
 public:
  CopyEngines();  // sized by cuda::DeviceCount()
  // kInvalidArgument for a device that does not exist (kUnsupported in a build without
  // CUDA); CopyEngine::Create's errors.
  Result<CopyEngine*> For(int device) EXCLUDES(mu_);
  int devices() const { return devices_; }
  // The engines' stats added up (those not made yet count nothing).
  CopyStats stats() EXCLUDES(mu_);

 private:
  const int devices_ = 0;  // engines_.size(), fixed at construction
  Mutex mu_;
  std::vector<std::unique_ptr<CopyEngine>> engines_ GUARDED_BY(mu_);  // by ordinal
};

// Lets kernels on `device` address memory of `peer` (once per pair; cached). kUnsupported
// when the two devices cannot reach each other directly.
Status EnablePeerAccess(int device, int peer);

// True when `ptr` is page-locked host memory that kernels on `device` address with the host
// pointer itself (registered mapped, or allocated with cudaHostAlloc, under UVA).
bool IsMappedHost(const void* ptr, int device);

}  // namespace ferry::cuda
