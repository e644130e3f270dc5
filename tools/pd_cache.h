// One `ferry pd` worker's KV cache: a buffer per region of its CacheLayout, registered with its
// engine, in host memory that peers of this host can map (so `shm` reaches it) or in GPU memory.
// Filling a layer and checking a request go through the pattern (pd_pattern.h); GPU regions go
// through a host mirror, a block's byte range at a time.
//
// Thread safety: FillLayer and Check may run on different threads for different requests
// (disjoint blocks); the mirrors of GPU regions are only touched in those blocks' ranges.
#pragma once

#include <memory>
#include <vector>

#include "buffers.h"
#include "ferry/engine.h"
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
  // Checks every layer of the request in `blocks`.
  Result<CheckReport> Check(uint64_t request, std::span<const uint64_t> blocks, uint64_t tokens);

 private:
  KvCache(Engine* engine, kv::CacheLayout layout, bool gpu)
      : engine_(engine), layout_(std::move(layout)), gpu_(gpu) {}
  // GPU: copies the byte ranges of `blocks` of `layer` (every layer when layer < 0) between the
  // device and the mirror.
  Status Stage(int64_t layer, std::span<const uint64_t> blocks, bool to_device);

  Engine* engine_;
  kv::CacheLayout layout_;
  bool gpu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<MemoryDesc> descs_;
  std::vector<std::vector<std::byte>> mirrors_;  // GPU only
  CacheView view_;                               // host pointers: the buffers, or the mirrors
};

}  // namespace ferry::tools::pd
