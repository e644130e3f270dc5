// CacheLayout's geometry (heads, validation) and the standard tensor orders (MakeLayout).
// The wire side of layouts (Pack/Unpack, the compatibility hash) is in layout_wire.cc.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/kv.h"

namespace ferry::kv {
namespace {

Status Invalid(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

// Overflow-checked arithmetic: false when the result does not fit in 64 bits.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool Add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// The last byte (exclusive) that `t` may touch: offset + (kblocks-1)*block_stride +
// (tokens-1)*token_stride + (heads-1)*head_stride + head_bytes. Strides are unsigned, so this
// corner bounds every (block, token, head, byte). False on overflow.
bool TensorEnd(const TensorLayout& t, uint64_t kblocks, uint64_t tokens, uint64_t heads,
               uint64_t head_bytes, uint64_t* end) {
  uint64_t a = 0, b = 0, c = 0, sum = 0;
  return Mul(kblocks - 1, t.block_stride, &a) && Mul(tokens - 1, t.token_stride, &b) &&
         Mul(heads - 1, t.head_stride, &c) && Add(t.offset, a, &sum) && Add(sum, b, &sum) &&
         Add(sum, c, &sum) && Add(sum, head_bytes, &sum) && (*end = sum, true);
}

constexpr std::array<std::pair<TensorOrder, std::string_view>, 7> kOrderNames = {{
    {TensorOrder::kKvFirst, "kv_first"},
    {TensorOrder::kKvFirstHnd, "kv_first_hnd"},
    {TensorOrder::kBlocksFirst, "blocks_first"},
    {TensorOrder::kBlocksFirstHnd, "blocks_first_hnd"},
    {TensorOrder::kSeparate, "separate"},
    {TensorOrder::kSeparateHnd, "separate_hnd"},
    {TensorOrder::kMla, "mla"},
}};

}  // namespace

uint32_t CacheLayout::heads() const {
  if (mla) return 1;
  if (tp_size == 0 || tp_size > total_kv_heads) return 1;  // replicated (or invalid: Validate)
  return total_kv_heads / tp_size;
}

uint32_t CacheLayout::first_head() const {
  if (mla || tp_size == 0) return 0;
  return static_cast<uint32_t>(uint64_t{tp_rank} * total_kv_heads / tp_size);
}

Status CacheLayout::Validate() const {
  if (model.size() > kMaxNameBytes) {
    return Invalid("model: name of " + std::to_string(model.size()) + " bytes exceeds " +
                   std::to_string(kMaxNameBytes));
  }
  if (num_layers == 0 || num_layers > kMaxLayers) {
    return Invalid("num_layers: " + std::to_string(num_layers) + " not in [1, " +
                   std::to_string(kMaxLayers) + "]");
  }
  if (tp_size == 0 || tp_size > kMaxTpSize) {
    return Invalid("tp_size: " + std::to_string(tp_size) + " not in [1, " +
                   std::to_string(kMaxTpSize) + "]");
  }
  if (tp_rank >= tp_size) {
    return Invalid("tp_rank: " + std::to_string(tp_rank) + " not below tp_size " +
                   std::to_string(tp_size));
  }
  if (total_kv_heads == 0 || total_kv_heads > kMaxHeads) {
    return Invalid("total_kv_heads: " + std::to_string(total_kv_heads) + " not in [1, " +
                   std::to_string(kMaxHeads) + "]");
  }
  if (mla && total_kv_heads != 1) {
    return Invalid("total_kv_heads: " + std::to_string(total_kv_heads) + " with mla (must be 1)");
  }
  if (!mla && total_kv_heads % tp_size != 0 && tp_size % total_kv_heads != 0) {
    return Invalid("tp_size: " + std::to_string(total_kv_heads) + " heads cannot be split over " +
                   std::to_string(tp_size) + " ranks");
  }
  if (head_dim == 0) return Invalid("head_dim: 0");
  if (dtype_bytes == 0) return Invalid("dtype_bytes: 0");
  if (block_tokens == 0) return Invalid("block_tokens: 0");
  if (num_blocks == 0) return Invalid("num_blocks: 0");
  if (block_tokens % kernel_block() != 0) {
    return Invalid("kernel_block_tokens: " + std::to_string(kernel_block()) +
                   " does not divide block_tokens " + std::to_string(block_tokens));
  }
  if (region_bytes.empty() || region_bytes.size() > kMaxRegions) {
    return Invalid("region_bytes: " + std::to_string(region_bytes.size()) + " regions not in [1, " +
                   std::to_string(kMaxRegions) + "]");
  }
  if (layers.size() != num_layers) {
    return Invalid("layers: " + std::to_string(layers.size()) + " entries for num_layers " +
                   std::to_string(num_layers));
  }
  uint64_t kblocks = 0;
  if (!Mul(num_blocks, block_tokens / kernel_block(), &kblocks)) {
    return Invalid("num_blocks: " + std::to_string(num_blocks) + " kernel blocks overflow");
  }
  const uint64_t hb = head_bytes();
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerLayout& layer = layers[l];
    const std::string where = "layer " + std::to_string(l) + " ";
    if (mla && layer.v) return Invalid(where + "v: present in an MLA layout");
    if (!mla && !layer.v) return Invalid(where + "v: absent (only MLA has no V)");
    for (int i = 0; i < (layer.v ? 2 : 1); ++i) {
      const TensorLayout& t = i == 0 ? layer.k : *layer.v;
      const std::string name = where + (i == 0 ? "k" : "v");
      if (t.region >= region_bytes.size()) {
        return Invalid(name + ".region: " + std::to_string(t.region) + " of " +
                       std::to_string(region_bytes.size()) + " regions");
      }
      uint64_t end = 0;
      if (!TensorEnd(t, kblocks, kernel_block(), heads(), hb, &end)) {
        return Invalid(name + ": offset and strides overflow");
      }
      if (end > region_bytes[t.region]) {
        return Invalid(name + ": reaches byte " + std::to_string(end) + " of region " +
                       std::to_string(t.region) + " (" + std::to_string(region_bytes[t.region]) +
                       " bytes)");
      }
    }
  }
  return Status::Ok();
}

std::string_view TensorOrderName(TensorOrder order) {
  for (const auto& [o, name] : kOrderNames) {
    if (o == order) return name;
  }
  return "unknown";
}

Result<TensorOrder> ParseTensorOrder(std::string_view name) {
  for (const auto& [o, n] : kOrderNames) {
    if (n == name) return o;
  }
  return Invalid("unknown tensor order '" + std::string(name.substr(0, 64)) + "'");
}

Result<CacheLayout> MakeLayout(CacheLayout identity, TensorOrder order, bool one_region) {
  CacheLayout& c = identity;
  // The counts MakeLayout relies on before it computes sizes; Validate checks the rest.
  if (c.num_layers == 0 || c.num_layers > kMaxLayers) {
    return Invalid("num_layers: " + std::to_string(c.num_layers) + " not in [1, " +
                   std::to_string(kMaxLayers) + "]");
  }
  if (c.block_tokens == 0 || c.kernel_block() == 0 || c.block_tokens % c.kernel_block() != 0) {
    return Invalid("kernel_block_tokens: " + std::to_string(c.kernel_block()) +
                   " does not divide block_tokens " + std::to_string(c.block_tokens));
  }
  if (c.tp_size == 0) return Invalid("tp_size: 0");
  const bool mla_order = order == TensorOrder::kMla;
  if (mla_order != c.mla) {
    return Invalid(std::string("mla: tensor order ") + std::string(TensorOrderName(order)) +
                   (c.mla ? " is not for MLA" : " requires mla"));
  }
  const uint64_t bs = c.kernel_block();
  const uint64_t h = c.heads();
  const uint64_t hb = c.head_bytes();
  uint64_t n = 0, token = 0, block = 0, tensor = 0, layer_bytes = 0, total = 0;
  // token: one token's heads; block: one kernel block of one tensor; tensor: N blocks.
  if (!Mul(c.num_blocks, c.block_tokens / bs, &n) || !Mul(h, hb, &token) ||
      !Mul(token, bs, &block) || !Mul(block, n, &tensor) ||
      !Mul(tensor, mla_order ? 1 : 2, &layer_bytes) ||
      !Mul(layer_bytes, c.num_layers, &total)) {
    return Invalid("num_blocks: the layout's size overflows");
  }
  const bool hnd = order == TensorOrder::kKvFirstHnd || order == TensorOrder::kBlocksFirstHnd ||
                   order == TensorOrder::kSeparateHnd;
  TensorLayout k;
  k.token_stride = hnd ? hb : token;
  k.head_stride = hnd ? bs * hb : hb;
  k.block_stride = block;
  uint64_t v_offset = tensor;  // V relative to K
  switch (order) {
    case TensorOrder::kKvFirst:
    case TensorOrder::kKvFirstHnd:
    case TensorOrder::kSeparate:
    case TensorOrder::kSeparateHnd:
      break;
    case TensorOrder::kBlocksFirst:
    case TensorOrder::kBlocksFirstHnd:
      k.block_stride = 2 * block;
      v_offset = block;
      break;
    case TensorOrder::kMla:
      k.token_stride = hb;
      k.head_stride = hb;
      break;
    default:
      return Invalid("unknown tensor order " + std::to_string(static_cast<int>(order)));
  }
  const bool separate = order == TensorOrder::kSeparate || order == TensorOrder::kSeparateHnd;
  c.layers.assign(c.num_layers, LayerLayout{});
  if (one_region) {
    c.region_bytes = {total};
  } else {
    c.region_bytes.assign(separate ? 2 * c.num_layers : c.num_layers, separate ? tensor : layer_bytes);
  }
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    LayerLayout& layer = c.layers[l];
    layer.k = k;
    layer.k.region = one_region ? 0 : (separate ? 2 * l : l);
    layer.k.offset = one_region ? l * layer_bytes : 0;
    if (mla_order) continue;
    TensorLayout v = layer.k;
    if (separate && !one_region) {
      v.region = 2 * l + 1;
    } else {
      v.offset += v_offset;
    }
    layer.v = v;
  }
  FERRY_RETURN_IF_ERROR(c.Validate());
  return identity;
}

}  // namespace ferry::kv
