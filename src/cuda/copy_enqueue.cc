// The copy engine's enqueues on the DMA engines: copies set aside by Post (one batched call),
// staged chunks of host-contiguous runs and 2D copies of strided runs (see copy_engine.h,
// PostOptions::host_side). Each runs under the engine's mutex, called from Post
// (copy_post.cc).
#include "cuda/copy_engine_core.h"
#include "cuda/cuda_status.h"

namespace ferry::cuda {

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
      ++stats.dma_calls;
      stats.dma_copies += dma.size();
      return Status::Ok();
    }
    (void)cudaGetLastError();  // e.g. a driver without batch copies: one call per piece
  }
#endif
  for (const Copy& c : dma) {
    FERRY_RETURN_IF_ERROR(
        ToStatus(cudaMemcpyAsync(c.dst, c.src, c.size, cudaMemcpyDefault, stream), "cudaMemcpyAsync"));
    *enqueued = true;
    ++stats.dma_calls;
    ++stats.dma_copies;
  }
  return Status::Ok();
}

Status CopyEngine::Core::EnqueueStagedLocked(const OffsetBatch& batch, bool host_is_dst, size_t at, size_t n,
                                             uint64_t bytes, uint64_t host_start, cudaStream_t* on) {
  const uint64_t slot = staged++ % kStageSlots;
  // The chunk keeps its host address's alignment mod kStageAlign in the slot: the DMA engine
  // then copies between equally aligned addresses.
  const std::byte* host = (host_is_dst ? batch.dst : batch.src) + host_start;
  std::byte* buffer = staging + slot * kStageSlotBytes + (reinterpret_cast<uintptr_t>(host) & (kStageAlign - 1));
  // The kernel adds each op's host-side offset to this base: the chunk's ops land in (or are
  // read from) [buffer, buffer + bytes), which lies inside the slot.
  char* shifted = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(buffer) - host_start);
  // The kernel reads the chunk's descriptors from the mapped host ring: an upload would be one
  // more copy on the DMA engines, and behind a chunk's copy it held the next chunk's kernel
  // back (on an H200, host -> GPU slabs at 0.94 of a 1 GiB copy with uploads, 0.98 without).
  const auto* ops = reinterpret_cast<const OffsetPiece*>(mapped_ring + at);
  const auto count = static_cast<uint32_t>(n);
  cudaStream_t launch_on = NextLaunchStreamLocked();
  *on = launch_on;
  if (host_is_dst) {
    // Gather into the slot once the slot's last chunk has gone to the host, then one DMA copy.
    FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamWaitEvent(launch_on, stage_free[slot], 0), "wait for a staging slot"));
    FERRY_RETURN_IF_ERROR(ToStatus(static_cast<cudaError_t>(LaunchOffsetCopy(
                                       ops, count, shifted, reinterpret_cast<const char*>(batch.src), batch.write,
                                       host_blocks, launch_on)),
                                   "launch staging gather"));
    FERRY_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stage_handoff[slot], launch_on), "record staging gather"));
    FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamWaitEvent(stage_stream, stage_handoff[slot], 0), "wait for staging gather"));
    FERRY_RETURN_IF_ERROR(ToStatus(
        cudaMemcpyAsync(batch.dst + host_start, buffer, bytes, cudaMemcpyDefault, stage_stream), "staging copy to host"));
    *on = stage_stream;
    FERRY_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stage_free[slot], stage_stream), "record staging copy"));
  } else {
    // One DMA copy into the slot once its last chunk was scattered, then scatter from it.
    FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamWaitEvent(stage_stream, stage_free[slot], 0), "wait for a staging slot"));
    FERRY_RETURN_IF_ERROR(ToStatus(
        cudaMemcpyAsync(buffer, batch.src + host_start, bytes, cudaMemcpyDefault, stage_stream), "staging copy from host"));
    FERRY_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stage_handoff[slot], stage_stream), "record staging copy"));
    FERRY_RETURN_IF_ERROR(ToStatus(cudaStreamWaitEvent(launch_on, stage_handoff[slot], 0), "wait for staging copy"));
    FERRY_RETURN_IF_ERROR(ToStatus(static_cast<cudaError_t>(LaunchOffsetCopy(
                                       ops, count, reinterpret_cast<char*>(batch.dst), shifted, batch.write,
                                       host_blocks, launch_on)),
                                   "launch staging scatter"));
    FERRY_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stage_free[slot], launch_on), "record staging scatter"));
  }
  ++stats.kernel_launches;
  stats.kernel_pieces += n;
  ++stats.dma_calls;
  ++stats.dma_copies;
  ++stats.staged_chunks;
  stats.staged_bytes += bytes;
  return Status::Ok();
}

Status CopyEngine::Core::EnqueueStridedLocked(const OffsetBatch& batch, const TransferOp& first, size_t count,
                                              uint64_t local_stride, uint64_t remote_stride) {
  const uint64_t dst_offset = batch.write ? first.remote_offset : first.local_offset;
  const uint64_t src_offset = batch.write ? first.local_offset : first.remote_offset;
  const uint64_t dst_pitch = batch.write ? remote_stride : local_stride;
  const uint64_t src_pitch = batch.write ? local_stride : remote_stride;
  FERRY_RETURN_IF_ERROR(ToStatus(cudaMemcpy2DAsync(batch.dst + dst_offset, dst_pitch, batch.src + src_offset, src_pitch,
                                                   first.size, count, cudaMemcpyDefault, stage_stream),
                                 "2D copy of a strided run"));
  ++stats.dma_calls;
  stats.dma_copies += count;
  ++stats.strided_runs;
  return Status::Ok();
}

}  // namespace ferry::cuda
