#include "pd_cache.h"

#include <cstring>
#include <numeric>

namespace ferry::tools::pd {

Result<std::unique_ptr<KvCache>> KvCache::Create(Engine* engine, kv::CacheLayout layout, bool gpu,
                                                 int device, HeadSlice heads) {
  std::unique_ptr<KvCache> cache(new KvCache(engine, std::move(layout), gpu));
  const MemoryKind kind = gpu ? MemoryKind::kCuda : MemoryKind::kHost;
  for (uint64_t bytes : cache->layout_.region_bytes) {
    // Host regions are shareable, so the shm transport maps them in the peer process.
    FERRY_ASSIGN_OR_RETURN(auto buffer, Buffer::Allocate(kind, device, bytes, HostAlloc::kShared));
    FERRY_ASSIGN_OR_RETURN(MemoryDesc desc,
                           engine->RegisterMemory(buffer->data(), bytes, kind, gpu ? device : -1));
    cache->buffers_.push_back(std::move(buffer));
    cache->descs_.push_back(desc);
    if (gpu) {
      FERRY_ASSIGN_OR_RETURN(void* mirror, gpu::PinnedAlloc(bytes));
      cache->mirrors_.emplace_back(static_cast<std::byte*>(mirror));
      std::memset(mirror, 0, bytes);
    }
  }
  cache->view_.layout = &cache->layout_;
  for (size_t i = 0; i < cache->buffers_.size(); ++i)
    cache->view_.regions.push_back(gpu ? cache->mirrors_[i].get() : cache->buffers_[i]->data());
  cache->view_.first_head = heads.first;
  cache->view_.heads = heads.count;
  return cache;
}

KvCache::~KvCache() {
  for (size_t i = 0; i < descs_.size(); ++i) DeregisterAndFree(*engine_, descs_[i], buffers_[i]);
}

uint64_t KvCache::bytes() const {
  return std::accumulate(layout_.region_bytes.begin(), layout_.region_bytes.end(), uint64_t{0});
}

Status KvCache::Stage(int64_t layer, std::span<const uint64_t> blocks, bool to_device,
                      gpu::Stream* stream) {
  const uint32_t first = layer < 0 ? 0 : static_cast<uint32_t>(layer);
  const uint32_t last = layer < 0 ? layout_.num_layers : first + 1;
  for (uint32_t l = first; l < last; ++l) {
    const kv::LayerLayout& ll = layout_.layers[l];
    for (const kv::TensorLayout* t : {&ll.k, ll.v ? &*ll.v : nullptr}) {
      if (t == nullptr) continue;
      for (uint64_t b : blocks) {
        const ByteRange r = BlockRange(layout_, *t, view_.heads, b);
        std::span<std::byte> host(mirrors_[t->region].get() + r.begin, r.end - r.begin);
        if (stream != nullptr) {
          FERRY_RETURN_IF_ERROR(
              stream->CopyAsync(buffers_[t->region]->data() + r.begin, host.data(), host.size()));
          continue;
        }
        FERRY_RETURN_IF_ERROR(to_device ? buffers_[t->region]->Write(r.begin, host)
                                        : buffers_[t->region]->Read(r.begin, host));
      }
    }
  }
  return Status::Ok();
}

Status KvCache::FillLayer(uint64_t request, uint32_t layer, std::span<const uint64_t> blocks,
                          uint64_t tokens) {
  pd::FillLayer(view_, request, layer, blocks, tokens);
  return gpu_ ? Stage(layer, blocks, /*to_device=*/true) : Status::Ok();
}

Status KvCache::FillLayerOn(gpu::Stream* stream, uint64_t request, uint32_t layer,
                            std::span<const uint64_t> blocks, uint64_t tokens) {
  if (!gpu_ || stream == nullptr)
    return Status(Code::kFailedPrecondition, "FillLayerOn: a KV cache in GPU memory and a stream");
  pd::FillLayer(view_, request, layer, blocks, tokens);
  return Stage(layer, blocks, /*to_device=*/true, stream);
}

Result<CheckReport> KvCache::Check(uint64_t request, std::span<const uint64_t> blocks,
                                   uint64_t tokens, uint64_t first_token) {
  if (gpu_) FERRY_RETURN_IF_ERROR(Stage(-1, blocks, /*to_device=*/false));
  return CheckRequest(view_, request, blocks, tokens, first_token);
}

}  // namespace ferry::tools::pd
