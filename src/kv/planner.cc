// The KV planner (planner.h): head routes between TP ranks and a request's byte ranges.
//
// How a plan is built. The request's tokens are cut into segments inside which both sides stay
// in one kernel block each; a segment maps token i to (base + i * token_stride) on each side.
// Each segment of each tensor is emitted as the largest pieces its strides allow (a whole
// segment, one per token, one per head, or one per (token, head)), and each piece is merged
// into the previous op when it follows it on both sides. One layer is planned this way; when
// the other layers share its strides (the usual case) their ops are that layer's shifted by
// each layer's tensor offsets, which costs a copy and an add per op.
#include "kv/planner.h"

#include <algorithm>
#include <string>
#include <utility>

namespace ferry::kv {
namespace {

Status Invalid(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }
Status OutOfRange(std::string message) { return Status(Code::kOutOfRange, std::move(message)); }

uint32_t ModelHeads(const TpPair& pair) { return pair.mla ? 1 : pair.total_heads; }

// How many source ranks hold each head the destination needs (replicated heads: several).
uint32_t Holders(const TpPair& pair) {
  const uint32_t h = ModelHeads(pair);
  return pair.src_tp <= h ? 1 : pair.src_tp / h;
}

HeadRange Intersect(HeadRange a, HeadRange b) {
  HeadRange r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.empty() ? HeadRange{} : r;
}

bool SendsToSomeone(const TpPair& pair, uint32_t src) {
  for (uint32_t d = 0; d < pair.dst_tp; ++d) {
    if (!RouteHeads(pair, src, d).empty()) return true;
  }
  return false;
}

// A run of tokens inside one kernel block on each side: kernel block and token within it.
struct Segment {
  uint64_t src_kblock;
  uint64_t dst_kblock;
  uint32_t src_token;
  uint32_t dst_token;
  uint32_t tokens;
};

// How a tensor's (token, head) grid is cut into pieces, from its strides on both sides.
enum class Cut : uint8_t {
  kRows,     // a token's heads are contiguous on both sides (one head, or head_stride == hb)
  kColumns,  // a head's tokens are contiguous on both sides (HND)
  kUnits,    // neither: one piece per (token, head)
};

struct TensorPair {
  const TensorLayout* src;
  const TensorLayout* dst;
};

class Planner {
 public:
  Planner(const CacheLayout& src, const CacheLayout& dst, HeadRange heads,
          std::vector<TransferOp>* ops)
      : src_(src), dst_(dst), ops_(ops), hb_(src.head_bytes()), nh_(heads.size()),
        src_head_(heads.begin - src.first_head()), dst_head_(heads.begin - dst.first_head()) {}

  // Emits one layer's ops into `ops_` (groups are appended to `groups`).
  void Layer(uint32_t layer, std::span<const Segment> segments, std::vector<OpGroup>* groups) {
    const LayerLayout& s = src_.layers[layer];
    const LayerLayout& d = dst_.layers[layer];
    TensorPair k{&s.k, &d.k};
    if (!s.v) {
      Tensors(layer, segments, &k, 1, groups);
      return;
    }
    TensorPair both[2] = {k, {&*s.v, &*d.v}};
    if (Interleaved(s) && Interleaved(d)) {
      // Blocks-first on both sides: K then V of a block are adjacent, so go block by block.
      const size_t begin = ops_->size();
      for (const Segment& seg : segments) {
        Emit(seg, both[0], begin);
        Emit(seg, both[1], begin);
      }
      Close(layer, both[0], begin, groups);
      return;
    }
    Tensors(layer, segments, both, 2, groups);
  }

 private:
  // V inside K's block stride, in the same region, with the same strides.
  static bool Interleaved(const LayerLayout& l) {
    const TensorLayout& k = l.k;
    const TensorLayout& v = *l.v;
    return k.region == v.region && k.block_stride == v.block_stride &&
           k.token_stride == v.token_stride && k.head_stride == v.head_stride &&
           v.offset > k.offset && v.offset - k.offset < k.block_stride;
  }

  // Tensor by tensor; consecutive tensors with the same region pair share a group.
  void Tensors(uint32_t layer, std::span<const Segment> segments, const TensorPair* tensors,
               int count, std::vector<OpGroup>* groups) {
    size_t begin = ops_->size();
    for (int i = 0; i < count; ++i) {
      const TensorPair& t = tensors[i];
      if (i > 0 && (t.src->region != tensors[i - 1].src->region ||
                    t.dst->region != tensors[i - 1].dst->region)) {
        Close(layer, tensors[i - 1], begin, groups);
        begin = ops_->size();
      }
      for (const Segment& seg : segments) Emit(seg, t, begin);
    }
    Close(layer, tensors[count - 1], begin, groups);
  }

  void Close(uint32_t layer, const TensorPair& t, size_t begin, std::vector<OpGroup>* groups) {
    OpGroup g;
    g.layer = layer;
    g.local_region = t.src->region;  // src/dst here; swapped for read mode at the end
    g.remote_region = t.dst->region;
    g.begin = begin;
    g.end = ops_->size();
    for (size_t i = begin; i < g.end; ++i) g.bytes += (*ops_)[i].size;
    if (g.end > g.begin) groups->push_back(g);
  }

  Cut CutOf(const TensorPair& t) const {
    if (nh_ == 1 || (t.src->head_stride == hb_ && t.dst->head_stride == hb_)) return Cut::kRows;
    if (t.src->token_stride == hb_ && t.dst->token_stride == hb_) return Cut::kColumns;
    return Cut::kUnits;
  }

  // Appends [s, s + size) -> [d, d + size), merged into the last op of the group when it
  // follows it on both sides.
  void Piece(uint64_t s, uint64_t d, uint64_t size, size_t group_begin) {
    if (ops_->size() > group_begin) {
      TransferOp& last = ops_->back();
      if (last.local_offset + last.size == s && last.remote_offset + last.size == d) {
        last.size += size;
        return;
      }
    }
    ops_->push_back(TransferOp{s, d, size});
  }

  void Emit(const Segment& seg, const TensorPair& t, size_t group_begin) {
    const TensorLayout& a = *t.src;
    const TensorLayout& b = *t.dst;
    const uint64_t s0 = a.offset + seg.src_kblock * a.block_stride +
                        seg.src_token * a.token_stride + src_head_ * a.head_stride;
    const uint64_t d0 = b.offset + seg.dst_kblock * b.block_stride +
                        seg.dst_token * b.token_stride + dst_head_ * b.head_stride;
    const uint64_t n = seg.tokens;
    switch (CutOf(t)) {
      case Cut::kRows: {
        const uint64_t row = nh_ * hb_;
        if (a.token_stride == row && b.token_stride == row) {
          Piece(s0, d0, n * row, group_begin);
        } else {
          for (uint64_t i = 0; i < n; ++i) {
            Piece(s0 + i * a.token_stride, d0 + i * b.token_stride, row, group_begin);
          }
        }
        break;
      }
      case Cut::kColumns:
        for (uint64_t h = 0; h < nh_; ++h) {
          Piece(s0 + h * a.head_stride, d0 + h * b.head_stride, n * hb_, group_begin);
        }
        break;
      case Cut::kUnits:
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t s = s0 + i * a.token_stride;
          const uint64_t d = d0 + i * b.token_stride;
          for (uint64_t h = 0; h < nh_; ++h) {
            Piece(s + h * a.head_stride, d + h * b.head_stride, hb_, group_begin);
          }
        }
        break;
    }
  }

  const CacheLayout& src_;
  const CacheLayout& dst_;
  std::vector<TransferOp>* ops_;
  const uint64_t hb_;
  const uint64_t nh_;
  const uint64_t src_head_;  // the first moving head, numbered locally on each side
  const uint64_t dst_head_;
};

bool SameStrides(const TensorLayout& a, const TensorLayout& b) {
  return a.block_stride == b.block_stride && a.token_stride == b.token_stride &&
         a.head_stride == b.head_stride;
}

// Layer `l` of `c` is layer `f` moved: the same strides, K and V sharing a region alike, and
// V at the same distance from K when they do. Its ops are then layer f's, shifted.
bool Shifted(const CacheLayout& c, uint32_t f, uint32_t l) {
  const LayerLayout& a = c.layers[f];
  const LayerLayout& b = c.layers[l];
  if (!SameStrides(a.k, b.k)) return false;
  if (!a.v) return true;
  if (!SameStrides(*a.v, *b.v)) return false;
  const bool shared = a.k.region == a.v->region;
  if (shared != (b.k.region == b.v->region)) return false;
  return !shared || a.v->offset - a.k.offset == b.v->offset - b.k.offset;
}

Status CheckBlocks(std::span<const uint64_t> blocks, const CacheLayout& c, const char* side) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] >= c.num_blocks) {
      return OutOfRange(std::string(side) + " block " + std::to_string(i) + ": id " +
                        std::to_string(blocks[i]) + " beyond num_blocks " +
                        std::to_string(c.num_blocks));
    }
  }
  return Status::Ok();
}

}  // namespace

HeadRange HeadsOf(uint32_t total_heads, bool mla, uint32_t tp_size, uint32_t tp_rank) {
  if (mla) return {0, 1};
  if (tp_size == 0 || total_heads == 0 || tp_rank >= tp_size) return {};
  const auto begin = static_cast<uint32_t>(uint64_t{tp_rank} * total_heads / tp_size);
  if (tp_size > total_heads) return {begin, begin + 1};
  return {begin, static_cast<uint32_t>(uint64_t{tp_rank + 1} * total_heads / tp_size)};
}

Status ValidateTpPair(const TpPair& pair) {
  for (const auto& [name, tp] : {std::pair{"src_tp", pair.src_tp}, std::pair{"dst_tp", pair.dst_tp}}) {
    if (tp == 0 || tp > kMaxTpSize) {
      return Invalid(std::string(name) + ": " + std::to_string(tp) + " not in [1, " +
                     std::to_string(kMaxTpSize) + "]");
    }
    if (pair.mla) continue;
    if (pair.total_heads == 0 || pair.total_heads > kMaxHeads) {
      return Invalid("total_heads: " + std::to_string(pair.total_heads) + " not in [1, " +
                     std::to_string(kMaxHeads) + "]");
    }
    if (pair.total_heads % tp != 0 && tp % pair.total_heads != 0) {
      return Invalid(std::string(name) + ": " + std::to_string(pair.total_heads) +
                     " heads cannot be split over " + std::to_string(tp) + " ranks");
    }
  }
  return Status::Ok();
}

HeadRange RouteHeads(const TpPair& pair, uint32_t src, uint32_t dst) {
  if (src >= pair.src_tp || dst >= pair.dst_tp) return {};
  // Every holder of a replicated head has the same index (src mod n) among its holders.
  const uint32_t n = Holders(pair);
  if (src % n != dst % n) return {};
  const uint32_t h = ModelHeads(pair);
  return Intersect(HeadsOf(h, pair.mla, pair.src_tp, src), HeadsOf(h, pair.mla, pair.dst_tp, dst));
}

std::vector<uint32_t> DestinationsOf(const TpPair& pair, uint32_t src) {
  std::vector<uint32_t> out;
  if (src >= pair.src_tp || pair.dst_tp == 0) return out;
  for (uint32_t d = 0; d < pair.dst_tp; ++d) {
    if (!RouteHeads(pair, src, d).empty()) out.push_back(d);
  }
  if (out.empty()) out.push_back(src % pair.dst_tp);
  return out;
}

std::vector<uint32_t> SourcesOf(const TpPair& pair, uint32_t dst) {
  std::vector<uint32_t> out;
  if (dst >= pair.dst_tp) return out;
  for (uint32_t s = 0; s < pair.src_tp; ++s) {
    if (!RouteHeads(pair, s, dst).empty() ||
        (s % pair.dst_tp == dst && !SendsToSomeone(pair, s))) {
      out.push_back(s);
    }
  }
  return out;
}

Status BuildPlan(const PlanInput& input, Plan* out) {
  out->Clear();
  if (input.src == nullptr || input.dst == nullptr) return Invalid("plan: a layout is missing");
  const CacheLayout& src = *input.src;
  const CacheLayout& dst = *input.dst;
  FERRY_RETURN_IF_ERROR(CheckCompatible(src, dst));
  const TpPair pair{src.total_kv_heads, src.mla, src.tp_size, dst.tp_size};
  FERRY_RETURN_IF_ERROR(ValidateTpPair(pair));
  if (src.tp_rank >= src.tp_size || dst.tp_rank >= dst.tp_size) {
    return Invalid("tp_rank: beyond tp_size");
  }
  const uint32_t layers = src.num_layers;
  if (input.first_layer >= layers ||
      uint64_t{input.first_layer} + input.layer_count > layers) {
    return OutOfRange("layers: [" + std::to_string(input.first_layer) + ", +" +
                      std::to_string(input.layer_count) + ") of " + std::to_string(layers));
  }
  const uint32_t layer_end = input.layer_count ? input.first_layer + input.layer_count : layers;
  FERRY_RETURN_IF_ERROR(CheckBlocks(input.src_blocks, src, "src"));
  FERRY_RETURN_IF_ERROR(CheckBlocks(input.dst_blocks, dst, "dst"));
  // Capacities in tokens (block counts are bounded by memory, so these cannot overflow).
  const uint64_t capacity = std::min(input.src_blocks.size() * uint64_t{src.block_tokens},
                                     input.dst_blocks.size() * uint64_t{dst.block_tokens});
  const uint64_t tokens = input.num_tokens ? input.num_tokens : capacity;
  if (tokens > capacity) {
    return OutOfRange("num_tokens: " + std::to_string(tokens) + " beyond the " +
                      std::to_string(capacity) + " the block lists hold");
  }
  const HeadRange heads = RouteHeads(pair, src.tp_rank, dst.tp_rank);
  out->heads = heads;
  if (heads.empty() || tokens == 0) return Status::Ok();
  out->tokens = tokens;

  std::vector<Segment> segments;
  const uint32_t src_kb = src.kernel_block(), dst_kb = dst.kernel_block();
  segments.reserve(tokens / std::max(src_kb, dst_kb) + 2);
  for (uint64_t t = 0; t < tokens;) {
    const uint64_t sw = t % src.block_tokens, dw = t % dst.block_tokens;
    Segment seg;
    seg.src_kblock = input.src_blocks[t / src.block_tokens] * (src.block_tokens / src_kb) + sw / src_kb;
    seg.dst_kblock = input.dst_blocks[t / dst.block_tokens] * (dst.block_tokens / dst_kb) + dw / dst_kb;
    seg.src_token = static_cast<uint32_t>(sw % src_kb);
    seg.dst_token = static_cast<uint32_t>(dw % dst_kb);
    seg.tokens = static_cast<uint32_t>(
        std::min<uint64_t>({src_kb - seg.src_token, dst_kb - seg.dst_token, tokens - t}));
    segments.push_back(seg);
    t += seg.tokens;
  }

  Planner planner(src, dst, heads, &out->ops);
  const uint32_t first = input.first_layer;
  planner.Layer(first, segments, &out->groups);
  const size_t pattern_ops = out->ops.size();
  const size_t pattern_groups = out->groups.size();
  out->ops.reserve(pattern_ops * (layer_end - first));
  out->groups.reserve(pattern_groups * (layer_end - first));
  for (uint32_t l = first + 1; l < layer_end; ++l) {
    if (!Shifted(src, first, l) || !Shifted(dst, first, l)) {
      planner.Layer(l, segments, &out->groups);
      continue;
    }
    const LayerLayout& s0 = src.layers[first];
    const LayerLayout& d0 = dst.layers[first];
    const LayerLayout& s = src.layers[l];
    const LayerLayout& d = dst.layers[l];
    for (size_t gi = 0; gi < pattern_groups; ++gi) {
      OpGroup g = out->groups[gi];
      // A group holds K (and V with it when they share regions), or V alone.
      const bool v_only = gi > 0;
      const TensorLayout& sf = v_only ? *s0.v : s0.k;
      const TensorLayout& df = v_only ? *d0.v : d0.k;
      const TensorLayout& sl = v_only ? *s.v : s.k;
      const TensorLayout& dl = v_only ? *d.v : d.k;
      const uint64_t ds = sl.offset - sf.offset;  // modular: adding it moves f's offsets to l's
      const uint64_t dd = dl.offset - df.offset;
      const size_t begin = out->ops.size();
      for (size_t i = g.begin; i < g.end; ++i) {
        const TransferOp& op = out->ops[i];
        out->ops.push_back(TransferOp{op.local_offset + ds, op.remote_offset + dd, op.size});
      }
      g.layer = l;
      g.local_region = sl.region;
      g.remote_region = dl.region;
      g.begin = begin;
      g.end = out->ops.size();
      out->groups.push_back(g);
    }
  }
  if (!input.poster_is_src) {
    for (TransferOp& op : out->ops) std::swap(op.local_offset, op.remote_offset);
    for (OpGroup& g : out->groups) std::swap(g.local_region, g.remote_region);
  }
  for (const OpGroup& g : out->groups) out->bytes += g.bytes;
  return Status::Ok();
}

}  // namespace ferry::kv
