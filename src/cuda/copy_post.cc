// CopyEngine::Post: one pass over a batch that cuts the kernel's pieces into the descriptor
// ring launch by launch and hands the rest to the DMA engines.
#include <algorithm>
#include <type_traits>
#include <thread>

#include "cuda/copy_engine_core.h"
#include "cuda/cuda_status.h"
#include "cuda/nvtx.h"
#include "cuda/runtime.h"

namespace ferry::cuda {
namespace {

static_assert(sizeof(OffsetPiece) == sizeof(Piece) && sizeof(OffsetPiece) == sizeof(TransferOp),
              "ops and pieces share the descriptor ring's slots");

// Pieces this large go to the DMA engines even when a kernel could copy them: one DMA engine
// fills the link on such a piece, and the SMs stay free for the model.
constexpr uint64_t kLargePieceBytes = 1 << 20;
// Batches of this many pieces or fewer go to the DMA engines: a descriptor upload and a launch
// cost more than a few cudaMemcpyAsync calls.
constexpr size_t kFewPieces = 4;
// One launch takes at most a quarter of the descriptor ring, so that batches overlap.
constexpr size_t kMaxLaunchPieces = kRingPieces / 4;
// The first launch of a batch carries at most this many pieces and each later one twice the
// last, so that the GPU starts while the CPU still fills descriptors for the rest: on an H200 a
// first launch of 32,768 pieces kept the link idle for about 1.4 ms of a 27 ms batch. Twice,
// not more: on the H200 machine's host the fill of a checked batch of offsets took about 4 ns an
// op (it reads ops that the checking threads wrote), half what the GPU takes to copy a 16 KiB
// op, so launches four times larger left the GPU waiting for descriptors (a trace: 100-130 us
// more GPU time than one launch of the batch); twice keeps the fill ahead of the copy. The
// launches alternate between two streams, so each one's tail overlaps the next one's start
// (bench/results/cuda_ipc.md).
constexpr size_t kFirstLaunchPieces = 2048;
constexpr size_t kLaunchGrowth = 2;
// Ops of a batch of offsets up to this size go to the kernel whole, one warp each; larger ones
// are cut into pieces of kMaxPieceBytes (or go to the DMA engines). KV blocks of 128 KiB then
// travel as one descriptor each, not two.
constexpr uint64_t kMaxWholeOpBytes = 256 * 1024;
// The largest row pitch a 2D copy takes (cudaDevAttrMaxPitch is 2^31 - 1 on the GPUs measured).
constexpr uint64_t kMaxPitch = (uint64_t{1} << 31) - 1;

// Whether op b follows op a at a fixed positive stride on both sides that a 2D copy takes: the
// same size, each side's offset grown by at least the size and at most kMaxPitch.
bool Strides(const TransferOp& a, const TransferOp& b, uint64_t* local_stride, uint64_t* remote_stride) {
  if (a.size == 0 || b.size != a.size || b.local_offset < a.local_offset + a.size ||
      b.remote_offset < a.remote_offset + a.size)
    return false;
  *local_stride = b.local_offset - a.local_offset;
  *remote_stride = b.remote_offset - a.remote_offset;
  return *local_stride <= kMaxPitch && *remote_stride <= kMaxPitch;
}

// Walks a batch (a span of Copy or an OffsetBatch) once: cuts the kernel's copies into pieces
// of at most kMaxPieceBytes as launches ask for them, and sets aside the copies that go to the
// DMA engines (those of kLargePieceBytes or more, or all when the batch goes there whole).
template <typename Source>
struct PieceCursor {
  const Source& copies;
  bool all_dma;
  bool large_to_dma;
  std::vector<Copy>* dma;
  // A batch of offsets whose host side may be staged (PostOptions::host_side, staging made).
  bool stage = false;
  bool host_is_dst = false;
  size_t index = 0;     // copy being cut
  uint64_t offset = 0;  // bytes of it already handed out

  bool done() const { return index == copies.size(); }

  // The host side's offset of op `o` (stage only): a write's destination offsets are remote.
  uint64_t HostOffset(const TransferOp& o) const {
    return host_is_dst == copies.write ? o.remote_offset : o.local_offset;
  }

  // For a batch of offsets: copies up to n ops as they are, stopping at the first that the
  // kernel does not take whole (over kMaxWholeOpBytes: cut by Fill, or for the DMA engines),
  // and, when staging, before a run of host-contiguous ops that reaches kStageMinBytes (it
  // goes through staging: StagedRun); returns how many. Zero when the cursor is inside a copy
  // being cut.
  size_t FillOffsets(OffsetPiece* out, size_t n) {
    if (offset != 0) return 0;
    size_t k = 0;
    size_t run_k = 0;  // where the current host-contiguous run starts in out
    uint64_t run_bytes = 0, run_end = 0;
    size_t strided_k = 0, strided_n = 0;  // the current strided run: first op in out, ops
    uint64_t local_stride = 0, remote_stride = 0;
    for (; k < n && index < copies.size(); ++index) {
      const TransferOp& o = copies.ops[index];
      if (o.size > kMaxWholeOpBytes || (large_to_dma && o.size >= kLargePieceBytes)) break;
      if (stage && k > 0) {  // a strided run (StridedRun) ends this launch where it starts
        const TransferOp& p = copies.ops[index - 1];
        uint64_t ls = 0, rs = 0;
        if (!Strides(p, o, &ls, &rs)) {
          strided_n = 0;
        } else if (strided_n > 0 && strided_k + strided_n == k && ls == local_stride && rs == remote_stride) {
          ++strided_n;
        } else {
          strided_k = k - 1;
          strided_n = 2;
          local_stride = ls;
          remote_stride = rs;
        }
        if (strided_n >= kStrideMinOps && strided_n * o.size >= kStageMinBytes) {
          index -= k - strided_k;
          k = strided_k;
          break;
        }
      }
      if (stage) {
        const uint64_t h = HostOffset(o);
        if (o.size == 0) {
          run_k = k + 1;
          run_bytes = 0;
        } else if (k > run_k && h == run_end) {
          run_bytes += o.size;
        } else {
          run_k = k;
          run_bytes = o.size;
        }
        run_end = h + o.size;
        if (run_bytes >= kStageMinBytes) {  // hand the run back: it starts the next launch
          index -= k - run_k;
          k = run_k;
          break;
        }
      }
      out[k++] = OffsetPiece{o.local_offset, o.remote_offset, o.size};
    }
    return k;
  }

  // Whether a strided run starts here: at least kStrideMinOps ops of one size, each a fixed
  // distance after the last on both sides (Strides), kStageMinBytes or more in all; if so its
  // length and the two strides. The ops are not consumed.
  bool StridedRun(size_t* count, uint64_t* local_stride, uint64_t* remote_stride) const {
    if (!stage || offset != 0 || index + 1 >= copies.size()) return false;
    if (!Strides(copies.ops[index], copies.ops[index + 1], local_stride, remote_stride)) return false;
    size_t i = index + 2;
    for (uint64_t ls = 0, rs = 0; i < copies.size(); ++i)
      if (!Strides(copies.ops[i - 1], copies.ops[i], &ls, &rs) || ls != *local_stride || rs != *remote_stride) break;
    *count = i - index;
    return *count >= kStrideMinOps && *count * copies.ops[index].size >= kStageMinBytes;
  }

  // Whether a run of host-contiguous ops (none empty, each taken whole by the kernel) of at
  // least kStageMinBytes starts here; if so, its first ops up to kStageChunkBytes in all: their
  // number, bytes and the host-side offset of the first. The ops are not consumed.
  bool StagedRun(size_t* count, uint64_t* bytes, uint64_t* host_start) const {
    if (!stage || offset != 0) return false;
    uint64_t b = 0, end = 0;
    size_t i = index;
    for (; i < copies.size(); ++i) {
      const TransferOp& o = copies.ops[i];
      if (o.size == 0 || o.size > kMaxWholeOpBytes || b + o.size > kStageChunkBytes || i - index == kMaxLaunchPieces)
        break;
      const uint64_t h = HostOffset(o);
      if (i == index) {
        *host_start = h;
      } else if (h != end) {
        break;
      }
      b += o.size;
      end = h + o.size;
    }
    *count = i - index;
    *bytes = b;
    return b >= kStageMinBytes;
  }

  // Copies the next n ops as they are (a run StagedRun found).
  void TakeOffsets(OffsetPiece* out, size_t n) {
    for (size_t k = 0; k < n; ++k, ++index) {
      const TransferOp& o = copies.ops[index];
      out[k] = OffsetPiece{o.local_offset, o.remote_offset, o.size};
    }
  }

  // Fills up to n pieces; returns how many. When staging, a batch of offsets stops at the next
  // op that the kernel takes whole, so that the launch loop looks for a strided or staged run
  // there (FillOffsets takes over).
  size_t Fill(Piece* out, size_t n) {
    size_t k = 0;
    while (k < n && index < copies.size()) {
      if constexpr (std::is_same_v<Source, OffsetBatch>) {
        if (stage && k > 0 && offset == 0) {
          const uint64_t size = copies.ops[index].size;
          if (size != 0 && size <= kMaxWholeOpBytes) break;
        }
      }
      const Copy c = copies[index];
      if (c.size == 0) {
        ++index;
        continue;
      }
      if (all_dma || (large_to_dma && c.size >= kLargePieceBytes)) {
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

Status CopyEngine::Core::UploadAndLaunchLocked(const Piece* host, Piece* dev, size_t n, const OffsetBatch* offsets,
                                               uint32_t blocks, cudaStream_t* on, bool* enqueued) {
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dev, host, n * sizeof(Piece), cudaMemcpyHostToDevice, upload_stream),
                                 "upload copy descriptors"));
  FERRY_RETURN_IF_ERROR(ToStatus(cudaEventRecord(upload_event, upload_stream), "record descriptor upload"));
  *on = NextLaunchStreamLocked();
  FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamWaitEvent(*on, upload_event, 0), "wait for descriptor upload"));
  *enqueued = true;
  const int launched =
      offsets != nullptr
          ? LaunchOffsetCopy(reinterpret_cast<const OffsetPiece*>(dev), static_cast<uint32_t>(n),
                             reinterpret_cast<char*>(offsets->dst), reinterpret_cast<const char*>(offsets->src),
                             offsets->write, blocks, *on)
          : LaunchBatchCopy(dev, static_cast<uint32_t>(n), blocks, *on);
  FERRY_RETURN_IF_ERROR(ToStatus(static_cast<cudaError_t>(launched), "launch batch copy kernel"));
  ++stats.kernel_launches;
  stats.kernel_pieces += n;
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
  PieceCursor<Source> cursor{copies, all_dma, options.large_to_dma, &dma};
  const bool want_stage = std::is_same_v<Source, OffsetBatch> && !all_dma &&
                          options.host_side != PostOptions::HostSide::kNone;
  cursor.host_is_dst = options.host_side == PostOptions::HostSide::kDst;
  const uint32_t blocks = options.host_side == PostOptions::HostSide::kNone ? max_blocks : host_blocks;
  auto completion = std::make_shared<Completion>();
  completion->engine_ = self;
  completion->on_done_ = std::move(options.on_done);

  DeviceGuard guard(device);
  FERRY_RETURN_IF_ERROR(guard.status());
  Done done;
  mu.Lock();
  bool enqueued = false;
  bool placed = false;  // the completion sits on a segment already
  Status error;
  if (all_dma) {
    dma.reserve(copies.size());
    for (size_t i = 0; i < copies.size(); ++i)
      if (const Copy c = copies[i]; c.size != 0) dma.push_back(c);
  }
  cursor.stage = want_stage && StagingLocked();
  auto backoff = std::chrono::microseconds(5);
  size_t launch = kFirstLaunchPieces;
  cudaStream_t last_on = stream;  // the stream of the batch's last launch
  // Ends a span of the batch's work on `on` with a segment (the completion's, when it is the
  // batch's last); false when no event could be recorded (the loop then stops).
  auto push = [&](cudaStream_t on, bool uses_ring, size_t ring_end) REQUIRES(mu) {
    last_on = on;
    const bool last = (cursor.done() && dma.empty()) || !error.ok();
    Status pushed = PushSegmentLocked(on, uses_ring, ring_end, last ? completion : nullptr, error);
    if (!pushed.ok()) {
      // Without an event the ring space cannot be tracked: wait here instead.
      SyncStreams();
      if (error.ok()) error = pushed;
      return false;
    }
    placed = last;
    return true;
  };
  // A batch that lies in one of this engine's op buffers, every op taken whole by the kernel, is
  // one launch that reads its ops where they lie (mapped host memory; each warp loads its next
  // op while it copies): no upload, no ring. On an H200, 80,000 ops of 16 KiB between two
  // processes reached 0.77-0.83 of a 1 GiB device copy this way (0.81 on average over six
  // rounds), against 0.76-0.80 (0.78) with the ops uploaded in slices of 2,048 growing twice
  // each, one launch per slice (six launches): the GPU starts sooner and the batch has one tail
  // (bench/results/cuda_ipc.md).
  const OpBuffer* direct = nullptr;
  if constexpr (std::is_same_v<Source, OffsetBatch>) {
    const OpBuffer* b = copies.buffer;
    if (b != nullptr && b->owner == this && b->hold && copies.ops.data() == b->ops && copies.size() <= b->capacity &&
        !all_dma && !cursor.stage && b->max_op_size <= kMaxWholeOpBytes &&
        !(options.large_to_dma && b->max_op_size >= kLargePieceBytes)) {
      direct = b;
      completion->hold_ = b->hold;
      ++stats.direct_batches;
    }
  }
  if (direct != nullptr) {
    if constexpr (std::is_same_v<Source, OffsetBatch>) {
      const size_t n = copies.size();
      cursor.index = n;
      cudaStream_t on = NextLaunchStreamLocked();
      const int launched = LaunchOffsetCopy(static_cast<const OffsetPiece*>(direct->mapped_ops), static_cast<uint32_t>(n),
                                            reinterpret_cast<char*>(copies.dst),
                                            reinterpret_cast<const char*>(copies.src), copies.write, blocks, on,
                                            /*ops_ahead=*/true);
      error = ToStatus(static_cast<cudaError_t>(launched), "launch batch copy kernel");
      if (error.ok()) {
        enqueued = true;
        ++stats.kernel_launches;
        stats.kernel_pieces += n;
        (void)push(on, false, 0);
      }
    }
  }
  while (error.ok() && !all_dma && !cursor.done()) {
    const size_t prev_head = head;
    size_t at = 0;
    // A strided run here is one 2D copy on the DMA engines (no descriptors).
    if constexpr (std::is_same_v<Source, OffsetBatch>) {
      size_t count = 0;
      uint64_t local_stride = 0, remote_stride = 0;
      if (cursor.StridedRun(&count, &local_stride, &remote_stride)) {
        const TransferOp first = copies.ops[cursor.index];
        cursor.index += count;
        error = EnqueueStridedLocked(copies, first, count, local_stride, remote_stride);
        if (!error.ok() && !enqueued) break;  // nothing moves: the caller learns it from Post
        enqueued = true;
        if (!push(stage_stream, false, 0)) break;
        continue;
      }
    }
    // A run of host-contiguous ops here goes through staging, a chunk at a time.
    size_t stage_n = 0;
    uint64_t stage_bytes = 0, stage_start = 0;
    if constexpr (std::is_same_v<Source, OffsetBatch>) {
      if (!cursor.StagedRun(&stage_n, &stage_bytes, &stage_start)) stage_n = 0;
    }
    if (!AllocRingLocked(stage_n > 0 ? stage_n : launch, &at)) {
      // The ring is full of batches in flight: complete what has finished, then back off.
      if (options.deadline.expired()) {
        error = Status(Code::kResourceExhausted, "CUDA copy descriptor ring stayed full until the deadline");
        break;
      }
      ReapLocked(&done, nullptr);
      mu.Unlock();
      RunDone(done);
      done.clear();
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(500));
      mu.Lock();
      continue;
    }
    // Straight into the page-locked ring: no copy in between. A batch of offsets goes as its
    // ops (the kernel adds the two bases), which costs the host a copy of each op instead of
    // computing a piece: on an H200 machine's host the pieces took 4.5 ns an op, longer than
    // the GPU took to copy the launch before (16 KiB in 8.6 ns an op), so the GPU waited.
    size_t n = 0;
    bool offsets = false;
    if constexpr (std::is_same_v<Source, OffsetBatch>) {
      if (stage_n > 0) {
        cursor.TakeOffsets(reinterpret_cast<OffsetPiece*>(host_ring + at), stage_n);
        n = stage_n;
      } else {
        n = cursor.FillOffsets(reinterpret_cast<OffsetPiece*>(host_ring + at), launch);
      }
      offsets = n > 0;
    }
    if (!offsets) n = cursor.Fill(host_ring + at, launch);
    if (n == 0) {  // the rest of the batch goes to the DMA engines
      head = prev_head;
      break;
    }
    head = at + n;  // hand back what this launch did not fill (the newest allocation)
    cudaStream_t on = stream;
    if (stage_n > 0) {
      // A staged chunk's kernel reads its descriptors where they are (EnqueueStagedLocked).
      if constexpr (std::is_same_v<Source, OffsetBatch>) {
        enqueued = true;
        error = EnqueueStagedLocked(copies, cursor.host_is_dst, at, n, stage_bytes, stage_start, &on);
        // Part of the chunk may be running on the other stream: let it end before the
        // batch's failure frees the ring and the caller's memory.
        if (!error.ok()) SyncStreams();
      }
    } else {
      // The ring's slots [at, at + n) are free: the kernels that read them last have completed
      // (their segments were reaped), so the upload may run beside the launches still copying.
      const OffsetBatch* as_offsets = nullptr;
      if constexpr (std::is_same_v<Source, OffsetBatch>) as_offsets = offsets ? &copies : nullptr;
      error = UploadAndLaunchLocked(host_ring + at, device_ring + at, n, as_offsets, blocks, &on, &enqueued);
      launch = std::min(launch * kLaunchGrowth, kMaxLaunchPieces);
    }
    if (!push(on, true, at + n)) break;
  }
  if (error.ok() && !dma.empty()) {
    error = EnqueueDmaLocked(dma, /*batched=*/!options.pageable, &enqueued);
    last_on = stream;  // the completion's event follows the DMA copies
  }
  if (enqueued) ++stats.batches;
  if (!placed) {
    if (!enqueued) {
      if (!error.ok()) {  // nothing moves: the caller learns it from Post
        mu.Unlock();
        return error;
      }
      done.push_back({completion, Status::Ok()});  // nothing to copy
    } else {
      // After the DMA copies, or after the launches when an enqueue failed: the launches' own
      // segments come first, so the completion waits for them too.
      Status pushed = PushSegmentLocked(last_on, false, 0, completion, error);
      if (!pushed.ok()) {
        SyncStreams();
        done.push_back({completion, error.ok() ? pushed : error});
      }
    }
  }
  mu.Unlock();
  cv.NotifyOne();
  RunDone(done);
  return completion;
}

Result<std::shared_ptr<Completion>> CopyEngine::Post(const OffsetBatch& batch, PostOptions options) {
  NvtxRange range("ferry copy_engine post");
  return core_->Post(core_, batch, std::move(options));
}

Result<std::shared_ptr<Completion>> CopyEngine::Post(std::span<const Copy> copies, PostOptions options) {
  NvtxRange range("ferry copy_engine post");
  return core_->Post(core_, copies, std::move(options));
}

}  // namespace ferry::cuda
