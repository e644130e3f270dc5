#include "embed/service/protocol.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "base/codec.h"

namespace ferry::embed::service {
namespace {

// The wire type of message M: its 1-based index in AnyMessage.
template <typename M, size_t I = 0>
constexpr uint64_t TypeOf() {
  if constexpr (std::is_same_v<M, std::variant_alternative_t<I, AnyMessage>>)
    return I + 1;
  else
    return TypeOf<M, I + 1>();
}

// Message m, [version, type, fields...]: `put` writes its `fields` fields.
template <typename M, typename Fields>
std::string EncodeMessage(const M&, uint32_t fields, Fields&& put) {
  codec::Writer w;
  w.Array(2 + fields);
  w.UInt(kEmbedProtocolVersion);
  w.UInt(TypeOf<M>());
  put(w);
  return w.Take();
}

void PutStatus(codec::Writer& w, const Status& s) {
  w.UInt(static_cast<uint64_t>(s.code()));
  std::string_view msg = s.message();
  w.Str(msg.substr(0, kMaxStatusMessage));
}

Status Bad(std::string what) {
  return Status(Code::kInvalidArgument, "malformed message: " + std::move(what));
}

Result<uint64_t> Bounded(codec::ArrayReader& r, std::string_view field, uint64_t lo, uint64_t hi) {
  FERRY_ASSIGN_OR_RETURN(uint64_t v, r.UInt(field));
  if (v < lo || v > hi)
    return Bad("field '" + std::string(field) + "' = " + std::to_string(v) + " outside [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Result<uint64_t> Aligned(codec::ArrayReader& r, std::string_view field) {
  FERRY_ASSIGN_OR_RETURN(uint64_t v, r.UInt(field));
  if (v % 4 != 0) return Bad("field '" + std::string(field) + "' is not 4-byte aligned");
  return v;
}

// The decoded status goes to *out (a Result<Status> would be ambiguous).
Status GetStatus(codec::ArrayReader& r, Status* out) {
  FERRY_ASSIGN_OR_RETURN(uint64_t code,
                         Bounded(r, "code", 0, static_cast<uint64_t>(Code::kInProgress)));
  FERRY_ASSIGN_OR_RETURN(std::string_view msg, r.Bytes("message", kMaxStatusMessage));
  *out = code == 0 ? Status::Ok() : Status(static_cast<Code>(code), std::string(msg));
  return Status::Ok();
}

// The fields of each message type, into m.
Status DecodeFields(codec::ArrayReader& r, Register& m) {
  FERRY_ASSIGN_OR_RETURN(uint64_t dp, Bounded(r, "dp_rank", 0, kMaxDpRanks - 1));
  FERRY_ASSIGN_OR_RETURN(uint64_t tp_size, Bounded(r, "tp_size", 1, kMaxTpSize));
  FERRY_ASSIGN_OR_RETURN(uint64_t tp, Bounded(r, "tp_rank", 0, tp_size - 1));
  FERRY_ASSIGN_OR_RETURN(uint64_t mode, Bounded(r, "mode", 0, 1));
  FERRY_ASSIGN_OR_RETURN(int64_t device, r.Int("device"));
  if (device < -1 || device > 1023) return Bad("field 'device' out of range");
  m.dp_rank = static_cast<uint32_t>(dp);
  m.tp_size = static_cast<uint32_t>(tp_size);
  m.tp_rank = static_cast<uint32_t>(tp);
  m.mode = static_cast<OutputMode>(mode);
  m.device = static_cast<int32_t>(device);
  FERRY_ASSIGN_OR_RETURN(m.max_tokens, Bounded(r, "max_tokens", 1, kMaxTokens));
  FERRY_ASSIGN_OR_RETURN(m.max_reqs, Bounded(r, "max_reqs", 1, kMaxRequests));
  FERRY_ASSIGN_OR_RETURN(m.context_len, Bounded(r, "context_len", 0, kMaxContext));
  FERRY_ASSIGN_OR_RETURN(m.token_bytes, Bounded(r, "token_bytes", 1, kMaxTokenBytes));
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader layers, r.Array("layers", kMaxLayers));
  if (layers.size() == 0) return Bad("no layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader l, layers.Array("layer", 5));
    LayerOutput out;
    FERRY_ASSIGN_OR_RETURN(uint64_t index, Bounded(l, "layer.index", 0, kMaxLayerIndex));
    out.layer = static_cast<uint32_t>(index);
    FERRY_ASSIGN_OR_RETURN(out.output_offset, Aligned(l, "layer.output_offset"));
    FERRY_ASSIGN_OR_RETURN(out.flag_offset, Aligned(l, "layer.flag_offset"));
    FERRY_ASSIGN_OR_RETURN(std::string_view oipc, l.Bytes("layer.output_ipc", kCudaIpcHandleBytes));
    FERRY_ASSIGN_OR_RETURN(std::string_view fipc, l.Bytes("layer.flag_ipc", kCudaIpcHandleBytes));
    size_t want = m.mode == OutputMode::kCuda ? kCudaIpcHandleBytes : 0;
    if (oipc.size() != want || fipc.size() != want) return Bad("IPC handle of the wrong size");
    out.output_ipc = std::string(oipc);
    out.flag_ipc = std::string(fipc);
    for (const LayerOutput& prev : m.layers)
      if (prev.layer == out.layer) return Bad("layer " + std::to_string(index) + " listed twice");
    m.layers.push_back(std::move(out));
  }
  FERRY_ASSIGN_OR_RETURN(m.has_inputs, r.Bool("has_inputs"));
  if (m.has_inputs != (m.tp_rank == 0)) return Bad("inputs must come from tp_rank 0 exactly");
  FERRY_ASSIGN_OR_RETURN(m.inputs.ids, Aligned(r, "inputs.ids"));
  FERRY_ASSIGN_OR_RETURN(m.inputs.query_start_loc, Aligned(r, "inputs.query_start_loc"));
  FERRY_ASSIGN_OR_RETURN(m.inputs.ngram_context, Aligned(r, "inputs.ngram_context"));
  return Status::Ok();
}

Status DecodeFields(codec::ArrayReader& r, Registered& m) { return GetStatus(r, &m.status); }

Status DecodeFields(codec::ArrayReader& r, Request& m) {
  FERRY_ASSIGN_OR_RETURN(m.seq, r.UInt("seq"));
  FERRY_ASSIGN_OR_RETURN(uint64_t dp, Bounded(r, "dp_rank", 0, kMaxDpRanks - 1));
  m.dp_rank = static_cast<uint32_t>(dp);
  FERRY_ASSIGN_OR_RETURN(uint64_t t, Bounded(r, "num_tokens", 0, kMaxTokens));
  FERRY_ASSIGN_OR_RETURN(uint64_t q, Bounded(r, "num_reqs", 0, kMaxRequests));
  m.num_tokens = static_cast<uint32_t>(t);
  m.num_reqs = static_cast<uint32_t>(q);
  return Status::Ok();
}

Status DecodeFields(codec::ArrayReader& r, Reply& m) {
  FERRY_ASSIGN_OR_RETURN(m.seq, r.UInt("seq"));
  return GetStatus(r, &m.status);
}

Status DecodeFields(codec::ArrayReader& r, StatsRequest& m) {
  FERRY_ASSIGN_OR_RETURN(m.reset, r.Bool("reset"));
  return Status::Ok();
}

constexpr uint32_t kBucketFields = 4 + 3 * kPhaseCount;

Status DecodeFields(codec::ArrayReader& r, Stats& m) {
  ServerStats& s = m.stats;
  FERRY_ASSIGN_OR_RETURN(s.registrations, r.UInt("registrations"));
  FERRY_ASSIGN_OR_RETURN(s.live_clients, r.UInt("live_clients"));
  FERRY_ASSIGN_OR_RETURN(s.steps_ok, r.UInt("steps_ok"));
  FERRY_ASSIGN_OR_RETURN(s.steps_failed, r.UInt("steps_failed"));
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader buckets, r.Array("buckets", kMaxStatBuckets));
  for (size_t i = 0; i < buckets.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader b, buckets.Array("bucket", kBucketFields));
    if (b.size() != kBucketFields) return Bad("a stats bucket of the wrong size");
    BucketStats out;
    FERRY_ASSIGN_OR_RETURN(out.bucket, Bounded(b, "bucket.tokens", 0, kMaxTokens));
    if (out.bucket != TokenBucket(out.bucket)) return Bad("a stats bucket not a power of two");
    if (!s.buckets.empty() && out.bucket <= s.buckets.back().bucket)
      return Bad("stats buckets out of order");
    FERRY_ASSIGN_OR_RETURN(out.cpu_steps, b.UInt("bucket.cpu_steps"));
    FERRY_ASSIGN_OR_RETURN(out.uva_steps, b.UInt("bucket.uva_steps"));
    FERRY_ASSIGN_OR_RETURN(out.copies, b.UInt("bucket.copies"));
    for (PhaseSummary& p : out.phases) {
      FERRY_ASSIGN_OR_RETURN(p.count, b.UInt("phase.count"));
      FERRY_ASSIGN_OR_RETURN(p.sum_ns, b.UInt("phase.sum_ns"));
      FERRY_ASSIGN_OR_RETURN(p.median_ns, b.UInt("phase.median_ns"));
    }
    s.buckets.push_back(out);
  }
  return Status::Ok();
}

template <typename M>
Result<AnyMessage> DecodeAs(codec::ArrayReader& r) {
  M m;
  FERRY_RETURN_IF_ERROR(DecodeFields(r, m));
  return AnyMessage(std::move(m));
}

// The decoder of each message, at its type - 1.
using Decoder = Result<AnyMessage> (*)(codec::ArrayReader&);
template <size_t... I>
constexpr std::array<Decoder, sizeof...(I)> Decoders(std::index_sequence<I...>) {
  return {DecodeAs<std::variant_alternative_t<I, AnyMessage>>...};
}
constexpr auto kDecoders = Decoders(std::make_index_sequence<std::variant_size_v<AnyMessage>>());

// One msgpack non-negative integer at bytes[*pos] (any width, unsigned or signed, as the
// decoder accepts), advancing *pos; nullopt for anything else.
std::optional<uint64_t> PrefixUInt(std::string_view bytes, size_t* pos) {
  if (*pos >= bytes.size()) return std::nullopt;
  const uint8_t tag = static_cast<uint8_t>(bytes[(*pos)++]);
  if (tag <= 0x7f) return tag;
  const bool is_signed = tag >= 0xd0 && tag <= 0xd3;
  const size_t width = (tag == 0xcc || tag == 0xd0)   ? 1
                       : (tag == 0xcd || tag == 0xd1) ? 2
                       : (tag == 0xce || tag == 0xd2) ? 4
                       : (tag == 0xcf || tag == 0xd3) ? 8
                                                      : 0;
  if (width == 0 || bytes.size() - *pos < width) return std::nullopt;
  if (is_signed && (static_cast<uint8_t>(bytes[*pos]) & 0x80) != 0) return std::nullopt;
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v = v << 8 | static_cast<uint8_t>(bytes[(*pos)++]);
  return v;
}

}  // namespace

std::optional<uint64_t> RequestSeqOf(std::string_view bytes) {
  if (bytes.empty()) return std::nullopt;
  size_t pos = 0;
  const uint8_t tag = static_cast<uint8_t>(bytes[pos++]);
  if (tag == 0xdc)
    pos += 2;
  else if (tag == 0xdd)
    pos += 4;
  else if ((tag & 0xf0) != 0x90)
    return std::nullopt;
  if (pos > bytes.size()) return std::nullopt;
  std::optional<uint64_t> version = PrefixUInt(bytes, &pos);
  if (version != kEmbedProtocolVersion) return std::nullopt;
  std::optional<uint64_t> type = PrefixUInt(bytes, &pos);
  if (type != TypeOf<Request>()) return std::nullopt;
  return PrefixUInt(bytes, &pos);
}

Register RegisterOf(const ClientOptions& o) {
  Register reg;
  reg.dp_rank = o.dp_rank;
  reg.tp_rank = o.tp_rank;
  reg.tp_size = o.tp_size;
  reg.max_tokens = o.max_tokens;
  reg.max_reqs = o.max_reqs;
  reg.context_len = o.context_len;
  reg.token_bytes = o.token_bytes;
  for (uint32_t layer : o.layers) reg.layers.push_back(LayerOutput{layer, 0, 0, "", ""});
  return reg;
}

std::string Encode(const Register& m) {
  return EncodeMessage(m, 14, [&](codec::Writer& w) {
    w.UInt(m.dp_rank);
    w.UInt(m.tp_size);
    w.UInt(m.tp_rank);
    w.UInt(static_cast<uint64_t>(m.mode));
    w.Int(m.device);
    w.UInt(m.max_tokens);
    w.UInt(m.max_reqs);
    w.UInt(m.context_len);
    w.UInt(m.token_bytes);
    w.Array(static_cast<uint32_t>(m.layers.size()));
    for (const LayerOutput& l : m.layers) {
      w.Array(5);
      w.UInt(l.layer);
      w.UInt(l.output_offset);
      w.UInt(l.flag_offset);
      w.Bin(l.output_ipc);
      w.Bin(l.flag_ipc);
    }
    w.Bool(m.has_inputs);
    w.UInt(m.inputs.ids);
    w.UInt(m.inputs.query_start_loc);
    w.UInt(m.inputs.ngram_context);
  });
}

std::string Encode(const Registered& m) {
  return EncodeMessage(m, 2,
                       [&](codec::Writer& w) { PutStatus(w, m.status); });
}

std::string Encode(const Request& m) {
  return EncodeMessage(m, 4, [&](codec::Writer& w) {
    w.UInt(m.seq);
    w.UInt(m.dp_rank);
    w.UInt(m.num_tokens);
    w.UInt(m.num_reqs);
  });
}

std::string Encode(const Reply& m) {
  return EncodeMessage(m, 3, [&](codec::Writer& w) {
    w.UInt(m.seq);
    PutStatus(w, m.status);
  });
}

std::string Encode(const StatsRequest& m) {
  return EncodeMessage(m, 1, [&](codec::Writer& w) { w.Bool(m.reset); });
}

std::string Encode(const Stats& m) {
  const ServerStats& s = m.stats;
  return EncodeMessage(m, 5, [&](codec::Writer& w) {
    w.UInt(s.registrations);
    w.UInt(s.live_clients);
    w.UInt(s.steps_ok);
    w.UInt(s.steps_failed);
    const size_t n = std::min(s.buckets.size(), kMaxStatBuckets);
    w.Array(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const BucketStats& b = s.buckets[i];
      w.Array(kBucketFields);
      w.UInt(b.bucket);
      w.UInt(b.cpu_steps);
      w.UInt(b.uva_steps);
      w.UInt(b.copies);
      for (const PhaseSummary& p : b.phases) {
        w.UInt(p.count);
        w.UInt(p.sum_ns);
        w.UInt(p.median_ns);
      }
    }
  });
}

Result<AnyMessage> Decode(std::string_view bytes) {
  codec::Limits limits;
  limits.max_bytes = 64 * 1024;
  limits.max_array = kMaxLayers + 16;
  limits.max_str = kMaxStatusMessage;
  limits.max_depth = 4;
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, limits));
  codec::ArrayReader r = reader.root();
  FERRY_ASSIGN_OR_RETURN(uint64_t version, r.UInt("version"));
  if (version != kEmbedProtocolVersion)
    return Status(Code::kUnsupported, "embedding protocol version " + std::to_string(version) +
                                          ", this build speaks " +
                                          std::to_string(kEmbedProtocolVersion));
  FERRY_ASSIGN_OR_RETURN(uint64_t type, r.UInt("type"));
  if (type < 1 || type > kDecoders.size())
    return Bad("unknown message type " + std::to_string(type));
  Result<AnyMessage> out = kDecoders[type - 1](r);
  if (out.ok() && !r.done()) return Bad("trailing fields");
  return out;
}

}  // namespace ferry::embed::service
