// One `ferry pd` worker's KV cache: a buffer per region of its CacheLayout, registered with its
// engine, in host memory that peers of this host can map (so `shm` reaches it) or in GPU memory.
// Filling a layer and checking a request go through the pattern (pd_pattern.h); GPU regions go
// through a host mirror (page-locked, so copies from it are asynchronous), a block's byte range
// at a time.
//
// Thread safety: FillLayer and Check may run on different threads for different requests
// (disjoint blocks); the mirrors of GPU regions are only touched in those blocks' ranges.
#pragma once

#include <memory>
#include <vector>

#include "buffers.h"
#include "ferry/engine.h"
#include "ferry/gpu.h"
#include "ferry/kv.h"
#include "pd_config.h"
#include "pd_pattern.h"

namespace ferry::tools::pd {

class KvCache {
 public:
  // Allocates and registers every region of `layout` (validated) with `engine`, which must
  // outlive the cache.
  static Result<std::unique_ptr<KvCache>> Create(Engine* engine, kv::CacheLayout layout, bool gpu,
                                                 int device, HeadSlice heads);
  ~KvCache();  // deregisters, then frees
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const kv::CacheLayout& layout() const { return layout_; }
  const std::vector<MemoryDesc>& regions() const { return descs_; }
  uint64_t bytes() const;

  // Writes layer `layer` of request `request` (its first `tokens` tokens) in `blocks`.
  Status FillLayer(uint64_t request, uint32_t layer, std::span<const uint64_t> blocks,
                   uint64_t tokens);
  // GPU memory: as FillLayer, but the copies from the mirror are enqueued on `stream` (after
  // the work already there); the layer is filled once the stream gets past them. The mirror's
  // bytes of these blocks must not change until then (the blocks are the request's alone).
  Status FillLayerOn(gpu::Stream* stream, uint64_t request, uint32_t layer,
                     std::span<const uint64_t> blocks, uint64_t tokens);
  // Checks every layer of the request: tokens [first_token, tokens) in `blocks`.
  Result<CheckReport> Check(uint64_t request, std::span<const uint64_t> blocks, uint64_t tokens,
                            uint64_t first_token = 0);

 private:
  KvCache(Engine* engine, kv::CacheLayout layout, bool gpu)
      : engine_(engine), layout_(std::move(layout)), gpu_(gpu) {}
  // GPU: copies the byte ranges of `blocks` of `layer` (every layer when layer < 0) between the
  // device and the mirror; on `stream` when given (to the device only), else synchronously.
  Status Stage(int64_t layer, std::span<const uint64_t> blocks, bool to_device,
               gpu::Stream* stream = nullptr);

  struct PinnedFree {
    void operator()(std::byte* p) const { (void)gpu::PinnedFree(p); }
  };

  Engine* engine_;
  kv::CacheLayout layout_;
  bool gpu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<MemoryDesc> descs_;
  std::vector<std::unique_ptr<std::byte, PinnedFree>> mirrors_;  // GPU only, page-locked
  CacheView view_;  // host pointers: the buffers, or the mirrors
};

}  // namespace ferry::tools::pd
