// The wire side of layouts and worker metadata: CacheLayout Pack/Unpack, the compatibility
// hash, CheckCompatible, and WorkerMetadata Pack/Unpack (what a handshake endpoint serves).
// (ReadParams, which travels beside the connector's messages, is in wire.cc.)
//
// WorkerMetadata decodes in two phases, as vLLM's NIXL handshake does: an envelope
// [magic, version, compatibility hash, body] whose version is checked before the body is
// parsed at all, so that a peer of another schema fails with "version", never with a field
// error; then the body, every part of it with its own decoder's bounds.
#include <cstdint>
#include <string>
#include <type_traits>

#include "base/codec.h"
#include "base/endian.h"
#include "ferry/kv.h"
#include "kv/handshake.h"

namespace ferry::kv {
namespace {

constexpr std::string_view kLayoutMagic = "ferry.kv.layout";
constexpr std::string_view kMetadataMagic = "ferry.kv.meta";
constexpr uint32_t kLayoutFields = 16;
constexpr uint32_t kTensorFields = 5;
constexpr uint32_t kMetadataFields = 4;
constexpr uint32_t kBodyFields = 6;
// Every layer with K and V (10 integers of at most 9 bytes), every region size, and the rest.
constexpr size_t kMaxLayoutBytes =
    kMaxLayers * (3 + 2 * kTensorFields * 9) + kMaxRegions * 9 + kMaxNameBytes + 1024;

Status Malformed(std::string_view what, std::string detail) {
  return Status(Code::kInvalidArgument,
                "malformed " + std::string(what) + ": " + std::move(detail));
}

template <typename T>
Status Differs(std::string_view field, const T& a, const T& b) {
  auto str = [](const T& v) {
    if constexpr (std::is_same_v<T, bool>)
      return std::string(v ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>)
      return v;
    else
      return std::to_string(v);
  };
  return Status(Code::kInvalidArgument, std::string(field) + ": " + str(a) + " vs " + str(b));
}

Status CheckHeader(codec::ArrayReader& r, std::string_view magic, std::string_view what,
                   uint32_t* version = nullptr) {
  FERRY_ASSIGN_OR_RETURN(std::string_view got, r.Bytes("magic", 32));
  if (got != magic) return Malformed(what, "not a " + std::string(magic) + " encoding");
  FERRY_ASSIGN_OR_RETURN(uint64_t v, r.UInt("version"));
  if (v != kKvVersion)
    return Status(Code::kInvalidArgument, std::string(what) + " version: " + std::to_string(v) +
                                              " vs " + std::to_string(kKvVersion));
  if (version) *version = static_cast<uint32_t>(v);
  return Status::Ok();
}

Result<uint32_t> UInt32(codec::ArrayReader& r, std::string_view field) {
  FERRY_ASSIGN_OR_RETURN(uint64_t v, r.UInt(field));
  if (v > UINT32_MAX) return Malformed("layout", std::string(field) + " out of range");
  return static_cast<uint32_t>(v);
}

void PutTensor(codec::Writer& w, const TensorLayout& t) {
  w.UInt(t.region);
  w.UInt(t.offset);
  w.UInt(t.block_stride);
  w.UInt(t.token_stride);
  w.UInt(t.head_stride);
}

Result<TensorLayout> GetTensor(codec::ArrayReader& r) {
  TensorLayout t;
  FERRY_ASSIGN_OR_RETURN(t.region, UInt32(r, "tensor region"));
  FERRY_ASSIGN_OR_RETURN(t.offset, r.UInt("tensor offset"));
  FERRY_ASSIGN_OR_RETURN(t.block_stride, r.UInt("block_stride"));
  FERRY_ASSIGN_OR_RETURN(t.token_stride, r.UInt("token_stride"));
  FERRY_ASSIGN_OR_RETURN(t.head_stride, r.UInt("head_stride"));
  return t;
}

// FNV-1a, 64 bits: stable across builds, compilers and hosts (unlike std::hash).
class Fnv1a {
 public:
  void Bytes(std::string_view bytes) {
    for (char c : bytes) {
      h_ ^= static_cast<uint8_t>(c);
      h_ *= 0x100000001b3ull;
    }
  }
  void U32(uint32_t v) {
    char b[4];
    StoreLe32(b, v);
    Bytes(std::string_view(b, 4));
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace

uint64_t CacheLayout::CompatibilityHash() const {
  // A canonical encoding: fixed-width little-endian fields, the model with its length first.
  Fnv1a h;
  h.Bytes(std::string_view("ferry.kv.compat", 16));  // with its NUL
  h.U32(kKvVersion);
  h.U32(static_cast<uint32_t>(model.size()));
  h.Bytes(model);
  h.U32(dtype_bytes);
  h.U32(head_dim);
  h.U32(total_kv_heads);
  h.U32(mla ? 1 : 0);
  h.U32(num_layers);
  return h.value();
}

Status CheckCompatible(const CacheLayout& a, const CacheLayout& b) {
  if (a.model != b.model) return Differs("model", a.model, b.model);
  if (a.dtype_bytes != b.dtype_bytes) return Differs("dtype_bytes", a.dtype_bytes, b.dtype_bytes);
  if (a.head_dim != b.head_dim) return Differs("head_dim", a.head_dim, b.head_dim);
  if (a.total_kv_heads != b.total_kv_heads)
    return Differs("total_kv_heads", a.total_kv_heads, b.total_kv_heads);
  if (a.mla != b.mla) return Differs("mla", a.mla, b.mla);
  if (a.num_layers != b.num_layers) return Differs("num_layers", a.num_layers, b.num_layers);
  return Status::Ok();
}

// [magic, version, model, dtype_bytes, head_dim, total_kv_heads, mla, num_layers, tp_rank,
//  tp_size, dp_rank, block_tokens, kernel_block_tokens, num_blocks, [region_bytes],
//  [[k: region, offset, block_stride, token_stride, head_stride, (v: the same five)]]]
std::string CacheLayout::Pack() const {
  codec::Writer w;
  w.Array(kLayoutFields);
  w.Str(kLayoutMagic);
  w.UInt(kKvVersion);
  w.Str(model);
  for (uint32_t v : {dtype_bytes, head_dim, total_kv_heads}) w.UInt(v);
  w.Bool(mla);
  for (uint32_t v : {num_layers, tp_rank, tp_size, dp_rank, block_tokens, kernel_block_tokens})
    w.UInt(v);
  w.UInt(num_blocks);
  w.Array(static_cast<uint32_t>(region_bytes.size()));
  for (uint64_t b : region_bytes) w.UInt(b);
  w.Array(static_cast<uint32_t>(layers.size()));
  for (const LayerLayout& l : layers) {
    w.Array(l.v ? 2 * kTensorFields : kTensorFields);
    PutTensor(w, l.k);
    if (l.v) PutTensor(w, *l.v);
  }
  return w.Take();
}

Result<CacheLayout> CacheLayout::Unpack(std::string_view bytes) {
  codec::Limits limits;
  limits.max_bytes = kMaxLayoutBytes;
  limits.max_array = kMaxRegions > kMaxLayers ? kMaxRegions : kMaxLayers;
  limits.max_str = 2 * kMaxNameBytes;  // a longer model is refused by its field, by name
  limits.max_depth = 3;
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, limits));
  codec::ArrayReader r = reader.root();
  FERRY_RETURN_IF_ERROR(CheckHeader(r, kLayoutMagic, "layout"));
  if (r.size() != kLayoutFields)
    return Malformed("layout",
                     std::to_string(r.size()) + " fields, not " + std::to_string(kLayoutFields));
  CacheLayout c;
  FERRY_ASSIGN_OR_RETURN(std::string_view model, r.Bytes("model", kMaxNameBytes));
  c.model = std::string(model);
  FERRY_ASSIGN_OR_RETURN(c.dtype_bytes, UInt32(r, "dtype_bytes"));
  FERRY_ASSIGN_OR_RETURN(c.head_dim, UInt32(r, "head_dim"));
  FERRY_ASSIGN_OR_RETURN(c.total_kv_heads, UInt32(r, "total_kv_heads"));
  FERRY_ASSIGN_OR_RETURN(c.mla, r.Bool("mla"));
  FERRY_ASSIGN_OR_RETURN(c.num_layers, UInt32(r, "num_layers"));
  FERRY_ASSIGN_OR_RETURN(c.tp_rank, UInt32(r, "tp_rank"));
  FERRY_ASSIGN_OR_RETURN(c.tp_size, UInt32(r, "tp_size"));
  FERRY_ASSIGN_OR_RETURN(c.dp_rank, UInt32(r, "dp_rank"));
  FERRY_ASSIGN_OR_RETURN(c.block_tokens, UInt32(r, "block_tokens"));
  FERRY_ASSIGN_OR_RETURN(c.kernel_block_tokens, UInt32(r, "kernel_block_tokens"));
  FERRY_ASSIGN_OR_RETURN(c.num_blocks, r.UInt("num_blocks"));
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader regions, r.Array("region_bytes", kMaxRegions));
  c.region_bytes.reserve(regions.size());
  while (!regions.done()) {
    FERRY_ASSIGN_OR_RETURN(uint64_t b, regions.UInt("region size"));
    c.region_bytes.push_back(b);
  }
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader layers, r.Array("layers", kMaxLayers));
  c.layers.reserve(layers.size());
  while (!layers.done()) {
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader t, layers.Array("layer", 2 * kTensorFields));
    if (t.size() != kTensorFields && t.size() != 2 * kTensorFields)
      return Malformed("layout", "a layer of " + std::to_string(t.size()) + " fields");
    LayerLayout l;
    FERRY_ASSIGN_OR_RETURN(l.k, GetTensor(t));
    if (!t.done()) {
      FERRY_ASSIGN_OR_RETURN(TensorLayout v, GetTensor(t));
      l.v = v;
    }
    c.layers.push_back(l);
  }
  // Counts, the TP split and every tensor's bytes inside its region.
  FERRY_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string WorkerId::ToString() const {
  return instance + "/dp" + std::to_string(dp_rank) + "/tp" + std::to_string(tp_rank);
}

// Envelope [magic, version, compatibility_hash, body]; body [instance, dp_rank, tp_rank,
// engine (EngineDesc::Pack), layout (CacheLayout::Pack), [regions (MemoryDesc::Pack)]].
std::string WorkerMetadata::Pack() const {
  codec::Writer body;
  body.Array(kBodyFields);
  body.Str(id.instance);
  body.UInt(id.dp_rank);
  body.UInt(id.tp_rank);
  body.Bin(engine.Pack());
  body.Bin(layout.Pack());
  body.Array(static_cast<uint32_t>(regions.size()));
  for (const MemoryDesc& d : regions) body.Bin(d.Pack());
  codec::Writer w;
  w.Array(kMetadataFields);
  w.Str(kMetadataMagic);
  w.UInt(version);
  w.UInt(compatibility_hash);
  w.Bin(body.Take());
  return w.Take();
}

Result<WorkerMetadata> WorkerMetadata::Unpack(std::string_view bytes) {
  constexpr std::string_view kWhat = "worker metadata";
  // Phase one: the envelope. Nothing of the body is read before the version matches.
  codec::Limits outer;
  outer.max_bytes = kMaxHandshakeBytes;
  outer.max_array = kMetadataFields;
  outer.max_str = kMaxHandshakeBytes;
  outer.max_depth = 1;
  FERRY_ASSIGN_OR_RETURN(codec::Reader envelope, codec::Reader::Parse(bytes, outer));
  codec::ArrayReader e = envelope.root();
  WorkerMetadata m;
  FERRY_RETURN_IF_ERROR(CheckHeader(e, kMetadataMagic, kWhat, &m.version));
  if (e.size() != kMetadataFields)
    return Malformed(kWhat,
                     std::to_string(e.size()) + " fields, not " + std::to_string(kMetadataFields));
  FERRY_ASSIGN_OR_RETURN(m.compatibility_hash, e.UInt("compatibility_hash"));
  FERRY_ASSIGN_OR_RETURN(std::string_view body_bytes, e.Bytes("body", kMaxHandshakeBytes));

  // Phase two: the body.
  codec::Limits inner;
  inner.max_bytes = kMaxHandshakeBytes;
  inner.max_array = kMaxRegions;
  inner.max_str = kMaxLayoutBytes > kMaxDescriptorBytes ? kMaxLayoutBytes : kMaxDescriptorBytes;
  inner.max_depth = 2;
  FERRY_ASSIGN_OR_RETURN(codec::Reader body, codec::Reader::Parse(body_bytes, inner));
  codec::ArrayReader r = body.root();
  if (r.size() != kBodyFields)
    return Malformed(kWhat, "a body of " + std::to_string(r.size()) + " fields, not " +
                                std::to_string(kBodyFields));
  FERRY_ASSIGN_OR_RETURN(std::string_view instance, r.Bytes("instance", kMaxNameBytes));
  if (instance.empty()) return Malformed(kWhat, "empty instance");
  m.id.instance = std::string(instance);
  FERRY_ASSIGN_OR_RETURN(uint64_t dp, r.UInt("dp_rank"));
  FERRY_ASSIGN_OR_RETURN(uint64_t tp, r.UInt("tp_rank"));
  FERRY_ASSIGN_OR_RETURN(std::string_view engine, r.Bytes("engine", kMaxDescriptorBytes));
  FERRY_ASSIGN_OR_RETURN(m.engine, EngineDesc::Unpack(engine));
  FERRY_ASSIGN_OR_RETURN(std::string_view layout, r.Bytes("layout", kMaxLayoutBytes));
  FERRY_ASSIGN_OR_RETURN(m.layout, CacheLayout::Unpack(layout));
  if (dp != m.layout.dp_rank || tp != m.layout.tp_rank)
    return Malformed(kWhat, "worker dp" + std::to_string(dp) + "/tp" + std::to_string(tp) +
                                " holds the layout of dp" + std::to_string(m.layout.dp_rank) +
                                "/tp" + std::to_string(m.layout.tp_rank));
  m.id.dp_rank = m.layout.dp_rank;
  m.id.tp_rank = m.layout.tp_rank;
  const uint64_t expected = m.layout.CompatibilityHash();
  if (m.compatibility_hash != expected)
    return Malformed(kWhat, "compatibility hash " + std::to_string(m.compatibility_hash) +
                                " does not match its layout's " + std::to_string(expected));
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader regions, r.Array("regions", kMaxRegions));
  if (regions.size() != m.layout.region_bytes.size())
    return Malformed(kWhat, std::to_string(regions.size()) + " regions for a layout of " +
                                std::to_string(m.layout.region_bytes.size()));
  m.regions.reserve(regions.size());
  for (size_t i = 0; !regions.done(); ++i) {
    FERRY_ASSIGN_OR_RETURN(std::string_view d, regions.Bytes("region", kMaxDescriptorBytes));
    FERRY_ASSIGN_OR_RETURN(MemoryDesc desc, MemoryDesc::Unpack(d));
    if (desc.size < m.layout.region_bytes[i])
      return Malformed(kWhat, "region " + std::to_string(i) + " of " + std::to_string(desc.size) +
                                  " bytes is smaller than the layout's " +
                                  std::to_string(m.layout.region_bytes[i]));
    if (desc.engine_key != m.engine.key)
      return Malformed(kWhat, "region " + std::to_string(i) + " belongs to engine '" +
                                  desc.engine_key + "', not '" + m.engine.key + "'");
    m.regions.push_back(std::move(desc));
  }
  return m;
}

}  // namespace ferry::kv
