// Per-layer checksums of KV, computed where the cache lives: on the CPU for host memory, by a
// kernel on a stream of the checksummer's own for GPU memory. Both give the same value for the
// same logical content, so a producer and a consumer with different layouts (TP size, block
// size, tensor order, memory kind) compare them.
//
// The checksum of layer L over tokens [0, tokens) and model heads [begin, end) is the sum mod
// 2^64 over every 8-byte word of every (token, head, K/V) slice of
//   cuda::LayerHashTerm(LayerHashSeed(L) + index * kLayerHashStep, word),
//   index = ((token * total_kv_heads + head) * 2 + kv) * words_per_head + word number,
// (src/cuda/layer_hash.h: the mix, and how a tail shorter than 8 bytes is read), except that a
// sum of 0 is reported as 1: 0 means "layer not written" in the completion message. A sum,
// unlike a chain, can be computed in parallel; the keyed mix makes swapped words, heads or
// tokens and zeroed blocks change it.
//
// Thread safety: LayerChecksum is a pure function over memory the caller keeps stable while it
// runs. A Checksummer is used by one thread at a time (the connector's worker thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/deadline.h"
#include "ferry/descriptors.h"
#include "ferry/kv.h"
#include "kv/planner.h"

namespace ferry::kv {

// The checksum of host memory. `bases[i]` is the address of region i in this process.
// `blocks` hold the tokens [0, tokens) that move; `heads` are model heads this side holds.
// REQUIRES: a validated layout, blocks in range and tokens within them (as BuildPlan checked).
uint64_t LayerChecksum(const CacheLayout& layout, std::span<const std::byte* const> bases,
                       std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer);

namespace internal {
struct GpuSlot;
}  // namespace internal

// A checksum being computed: the value (host memory) or where it lands (GPU memory). Holding
// it keeps its buffers from reuse; dropping it before Finish is fine.
class PendingChecksum {
 public:
  PendingChecksum() = default;
  bool started() const { return started_; }

 private:
  friend class Checksummer;
  bool started_ = false;
  uint64_t value_ = 0;
  std::shared_ptr<internal::GpuSlot> slot_;
};

class Checksummer {
 public:
  // `regions`: the layout's regions in this process, in order. Each layer's tensors must lie in
  // host memory, or all in GPU memory of one device (the same for every GPU layer); otherwise,
  // or for GPU memory in a build without CUDA, kUnsupported. The stream of GPU checksums is
  // made by the first Start of a GPU layer, on its thread.
  static Result<std::unique_ptr<Checksummer>> Create(const CacheLayout& layout, std::span<const MemoryDesc> regions);
  ~Checksummer();
  Checksummer(const Checksummer&) = delete;
  Checksummer& operator=(const Checksummer&) = delete;

  // Starts the checksum of `layer` over `blocks`, `tokens` and `heads` (as LayerChecksum).
  // Host memory: computed now. GPU memory: enqueued (the block list copied to the device) and
  // returns at once; the calling thread's current device becomes the cache's. The data must be
  // complete before the call (e.g. the layer's CUDA event waited for). kOutOfRange for a
  // layer, block, token count or head range this side cannot hold; kInternal when CUDA fails.
  Result<PendingChecksum> Start(std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer);
  // The value of a started checksum, waiting for the GPU until `deadline`
  // (kDeadlineExceeded). REQUIRES: pending.started().
  Result<uint64_t> Finish(PendingChecksum& pending, Deadline deadline);
  // Finish of each of `pending` into (*out)[i], 0 for one not started; `out` is resized.
  Status FinishAll(std::span<PendingChecksum> pending, Deadline deadline, std::vector<uint64_t>* out);

  bool on_gpu(uint32_t layer) const { return layer < gpu_layer_.size() && gpu_layer_[layer]; }

 private:
  Checksummer(const CacheLayout& layout, std::span<const MemoryDesc> regions);
  Result<PendingChecksum> StartGpu(std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer);
  Result<std::shared_ptr<internal::GpuSlot>> FreeSlot(size_t blocks);

  CacheLayout layout_;
  std::vector<const std::byte*> bases_;
  std::vector<bool> gpu_layer_;
  int device_ = -1;         // of the GPU layers; -1 when none
  void* stream_ = nullptr;  // cudaStream_t, created when some layer is on the GPU
  std::vector<std::shared_ptr<internal::GpuSlot>> slots_;
};

}  // namespace ferry::kv
