#include "kv/checksum.h"

#include <bit>
#include <chrono>
#include <cstring>
#include <string>

#include "cuda/layer_hash.h"
#include "cuda/runtime.h"
#include "cuda/stream_ops.h"

namespace ferry::kv {

// The GPU reads words little-endian; the host's memcpy into a uint64_t must read them alike.
static_assert(std::endian::native == std::endian::little, "the layer checksum assumes a little-endian host");

namespace {

using cuda::kLayerHashStep;

// The terms of one slice of `bytes` bytes at `p` whose first word's key is `key`.
uint64_t SliceSum(const std::byte* p, uint64_t bytes, uint64_t key) {
  uint64_t sum = 0;
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8, key += kLayerHashStep) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    sum += cuda::LayerHashTerm(key, v);
  }
  if (i < bytes) {
    uint64_t v = 0;
    std::memcpy(&v, p + i, bytes - i);
    sum += cuda::LayerHashTerm(key, v);
  }
  return sum;
}

uint64_t Reported(uint64_t sum) { return sum == 0 ? 1 : sum; }

}  // namespace

uint64_t LayerChecksum(const CacheLayout& layout, std::span<const std::byte* const> bases,
                       std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads, uint32_t layer) {
  const LayerLayout& l = layout.layers[layer];
  const uint64_t kb = layout.kernel_block();
  const uint64_t ratio = layout.block_tokens / kb;
  const uint64_t hb = layout.head_bytes();
  const uint64_t words = (hb + 7) / 8;
  const uint64_t seed = cuda::LayerHashSeed(layer);
  const TensorLayout* tensors[2] = {&l.k, l.v ? &*l.v : nullptr};
  uint64_t sum = 0;
  for (uint64_t t = 0; t < tokens; ++t) {
    const uint64_t in = t % layout.block_tokens;
    const uint64_t kblock = blocks[t / layout.block_tokens] * ratio + in / kb;
    for (uint32_t head = heads.begin; head < heads.end; ++head) {
      const uint64_t local = layout.mla ? 0 : head - layout.first_head();
      for (uint64_t kv = 0; kv < 2; ++kv) {
        const TensorLayout* tl = tensors[kv];
        if (tl == nullptr) continue;
        const std::byte* p = bases[tl->region] + tl->offset + kblock * tl->block_stride + (in % kb) * tl->token_stride +
                             local * tl->head_stride;
        const uint64_t index = ((t * layout.total_kv_heads + head) * 2 + kv) * words;
        sum += SliceSum(p, hb, seed + index * kLayerHashStep);
      }
    }
  }
  return Reported(sum);
}

namespace internal {

// The buffers of one GPU checksum: the block list goes up through `host`, the sum comes back
// into it. Reused once nobody holds it and its event (recorded after the sum's copy back)
// completed.
struct GpuSlot {
  void* event = nullptr;
  uint64_t* host = nullptr;    // page-locked: [0] the sum, [1] a zero, [2, 2 + capacity) the blocks
  uint64_t* device = nullptr;  // [0] the sum, [1, 1 + capacity) the blocks
  size_t capacity = 0;
  GpuSlot() = default;
  GpuSlot(const GpuSlot&) = delete;
  GpuSlot& operator=(const GpuSlot&) = delete;
  ~GpuSlot() {
    if (event != nullptr) {
      // Its copies may still run (a request dropped mid-checksum): the buffers stay until then.
      (void)cuda::EventSync(event, Deadline::After(std::chrono::seconds(10)));
      (void)cuda::EventDestroy(event);
    }
    if (device != nullptr) (void)cuda::Free(device);
    if (host != nullptr) (void)cuda::HostFree(host);
  }
};

}  // namespace internal

namespace {

Result<std::shared_ptr<internal::GpuSlot>> NewSlot(int device, size_t blocks) {
  auto slot = std::make_shared<internal::GpuSlot>();
  slot->capacity = std::bit_ceil(std::max<size_t>(blocks, 64));
  FERRY_ASSIGN_OR_RETURN(slot->event, cuda::EventCreate());
  FERRY_ASSIGN_OR_RETURN(void* host, cuda::HostAlloc((slot->capacity + 2) * sizeof(uint64_t)));
  slot->host = static_cast<uint64_t*>(host);
  FERRY_ASSIGN_OR_RETURN(void* dev, cuda::Malloc(device, (slot->capacity + 1) * sizeof(uint64_t)));
  slot->device = static_cast<uint64_t*>(dev);
  return slot;
}

}  // namespace

Checksummer::Checksummer(const CacheLayout& layout, std::span<const MemoryDesc> regions) : layout_(layout) {
  for (const MemoryDesc& r : regions) bases_.push_back(reinterpret_cast<const std::byte*>(r.address));
}

Result<std::unique_ptr<Checksummer>> Checksummer::Create(const CacheLayout& layout,
                                                         std::span<const MemoryDesc> regions) {
  FERRY_RETURN_IF_ERROR(layout.Validate());
  if (regions.size() != layout.region_bytes.size()) {
    return Status(Code::kInvalidArgument, "checksums: the layout has " + std::to_string(layout.region_bytes.size()) +
                                              " regions but " + std::to_string(regions.size()) + " were given");
  }
  std::unique_ptr<Checksummer> c(new Checksummer(layout, regions));
  c->gpu_layer_.assign(layout.num_layers, false);
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    const LayerLayout& l = layout.layers[layer];
    const MemoryDesc& k = regions[l.k.region];
    const MemoryDesc& v = regions[l.v ? l.v->region : l.k.region];
    if (k.kind != v.kind || (k.kind == MemoryKind::kCuda && k.device != v.device)) {
      return Status(Code::kUnsupported, "checksums: K and V of layer " + std::to_string(layer) +
                                            " lie in different kinds of memory or on different GPUs");
    }
    if (k.kind != MemoryKind::kCuda) continue;
    if (k.device < 0) return Status(Code::kInvalidArgument, "checksums: a GPU region names no device");
    if (c->device_ >= 0 && c->device_ != k.device) {
      return Status(Code::kUnsupported, "checksums: the cache lies on more than one GPU");
    }
    c->device_ = k.device;
    c->gpu_layer_[layer] = true;
  }
  if (c->device_ >= 0 && !cuda::Built()) {
    return Status(Code::kUnsupported, "checksums of GPU memory need ferry built with CUDA");
  }
  return c;
}

Checksummer::~Checksummer() {
  slots_.clear();  // each waits for its own work
  if (stream_ != nullptr) (void)cuda::StreamDestroy(stream_);
}

Result<PendingChecksum> Checksummer::Start(std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads,
                                           uint32_t layer) {
  // The block list, token count and heads may come from a peer's message: check them all
  // before any address is formed.
  if (layer >= layout_.num_layers) return Status(Code::kOutOfRange, "checksum of layer " + std::to_string(layer));
  if (tokens > blocks.size() * uint64_t{layout_.block_tokens}) {
    return Status(Code::kOutOfRange, "checksum of " + std::to_string(tokens) + " tokens in " +
                                         std::to_string(blocks.size()) + " blocks");
  }
  const size_t used = static_cast<size_t>((tokens + layout_.block_tokens - 1) / layout_.block_tokens);
  for (size_t i = 0; i < used; ++i) {
    if (blocks[i] >= layout_.num_blocks) {
      return Status(Code::kOutOfRange, "checksum over block " + std::to_string(blocks[i]) + " of " +
                                           std::to_string(layout_.num_blocks));
    }
  }
  const HeadRange held = HeadsOf(layout_.total_kv_heads, layout_.mla, layout_.tp_size, layout_.tp_rank);
  if (!heads.empty() && (heads.begin < held.begin || heads.end > held.end)) {
    return Status(Code::kOutOfRange, "checksum over heads [" + std::to_string(heads.begin) + ", " +
                                         std::to_string(heads.end) + ") that this side does not hold");
  }
  if (heads.empty()) heads = {};
  if (gpu_layer_[layer]) return StartGpu(blocks.first(used), tokens, heads, layer);
  PendingChecksum p;
  p.started_ = true;
  p.value_ = LayerChecksum(layout_, bases_, blocks, tokens, heads, layer);
  return p;
}

Result<std::shared_ptr<internal::GpuSlot>> Checksummer::FreeSlot(size_t blocks) {
  for (auto& slot : slots_) {
    if (slot.use_count() != 1) continue;  // a PendingChecksum holds it
    if (!cuda::EventSync(slot->event, Deadline::At(Clock::time_point{})).ok()) continue;  // still running
    if (slot->capacity < blocks) {
      FERRY_ASSIGN_OR_RETURN(slot, NewSlot(device_, blocks));
    }
    return slot;
  }
  FERRY_ASSIGN_OR_RETURN(auto slot, NewSlot(device_, blocks));
  slots_.push_back(slot);
  return slot;
}

Result<PendingChecksum> Checksummer::StartGpu(std::span<const uint64_t> blocks, uint64_t tokens, HeadRange heads,
                                              uint32_t layer) {
  FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
  // Made here, on the thread that uses it, so that Create leaves its caller's device alone.
  if (stream_ == nullptr) {
    FERRY_ASSIGN_OR_RETURN(stream_, cuda::StreamCreate());
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<internal::GpuSlot> slot, FreeSlot(blocks.size()));
  slot->host[1] = 0;
  if (!blocks.empty()) std::memcpy(slot->host + 2, blocks.data(), blocks.size_bytes());
  FERRY_RETURN_IF_ERROR(
      cuda::MemcpyAsync(slot->device, slot->host + 1, (blocks.size() + 1) * sizeof(uint64_t), stream_));

  const LayerLayout& l = layout_.layers[layer];
  cuda::LayerHashArgs a{};
  a.num_tensors = l.v ? 2 : 1;
  for (uint32_t i = 0; i < a.num_tensors; ++i) {
    const TensorLayout& tl = i == 0 ? l.k : *l.v;
    a.tensors[i] = {reinterpret_cast<const uint8_t*>(bases_[tl.region] + tl.offset), tl.block_stride,
                    tl.token_stride, layout_.mla ? 0 : tl.head_stride};
  }
  a.blocks = slot->device + 1;
  a.tokens = tokens;
  a.block_tokens = layout_.block_tokens;
  a.kernel_block = layout_.kernel_block();
  a.head_begin = heads.begin;
  a.head_count = heads.size();
  a.local_first = layout_.mla || heads.empty() ? 0 : heads.begin - layout_.first_head();
  a.total_heads = layout_.total_kv_heads;
  a.head_bytes = layout_.head_bytes();
  a.seed = cuda::LayerHashSeed(layer);
  a.out = reinterpret_cast<unsigned long long*>(slot->device);
  if (int e = cuda::LaunchLayerHash(a, static_cast<CUstream_st*>(stream_)); e != 0) {
    return Status(Code::kInternal, "the layer checksum kernel did not launch (error " + std::to_string(e) + ")");
  }
  FERRY_RETURN_IF_ERROR(cuda::MemcpyAsync(slot->host, slot->device, sizeof(uint64_t), stream_));
  FERRY_RETURN_IF_ERROR(cuda::EventRecord(slot->event, stream_));
  PendingChecksum p;
  p.started_ = true;
  p.slot_ = std::move(slot);
  return p;
}

Result<uint64_t> Checksummer::Finish(PendingChecksum& pending, Deadline deadline) {
  if (!pending.started_) return Status(Code::kFailedPrecondition, "checksum not started");
  if (pending.slot_ != nullptr) {
    FERRY_RETURN_IF_ERROR(cuda::EventSync(pending.slot_->event, deadline).WithContext("layer checksum"));
    pending.value_ = Reported(pending.slot_->host[0]);
    pending.slot_.reset();
  }
  return pending.value_;
}

Status Checksummer::FinishAll(std::span<PendingChecksum> pending, Deadline deadline, std::vector<uint64_t>* out) {
  out->assign(pending.size(), 0);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (!pending[i].started()) continue;
    FERRY_ASSIGN_OR_RETURN((*out)[i], Finish(pending[i], deadline));
  }
  return Status::Ok();
}

}  // namespace ferry::kv
