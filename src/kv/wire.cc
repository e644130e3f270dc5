// The connector's messages and ReadParams on the wire. Each is a msgpack array whose first
// element is kKvVersion, so that a peer of another version is refused by its version before any
// field of a shape it may not know is read.
//
// Block lists travel as runs of consecutive ids, packed as LEB128 varint pairs (first, count)
// inside one msgpack bin: a scheduler's allocation is mostly consecutive, so a 1000-block
// allocation is a few bytes, and a hostile list costs the decoder no msgpack object per
// element. The decoder sums the runs (bounded by kMaxMessageBlocks) before it allocates.
#include "kv/wire.h"

#include <limits>
#include <string>

#include "base/codec.h"

namespace ferry::kv {
namespace {

constexpr uint32_t kMessageFields = 15;
constexpr uint32_t kReadParamsFields = 9;
// A varint is at most 10 bytes, a run two of them.
constexpr size_t kMaxRunBytes = 20 * kMaxMessageBlocks;
constexpr size_t kMaxEncodedBytes = kMaxRunBytes + 64 * 1024;

codec::Limits WireLimits() {
  codec::Limits limits;
  limits.max_bytes = kMaxEncodedBytes;
  limits.max_array = kMaxMessageLayers > kMessageFields ? kMaxMessageLayers : kMessageFields;
  limits.max_str = kMaxRunBytes;  // the runs bin; every other string has its own, smaller bound
  limits.max_depth = 3;
  return limits;
}

Status Malformed(std::string what) {
  return Status(Code::kInvalidArgument, "malformed kv message: " + std::move(what));
}

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Reads one varint at *pos; false when it is cut off or overflows 64 bits.
bool GetVarint(std::string_view in, size_t* pos, uint64_t* v) {
  uint64_t out = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= in.size()) return false;
    const auto byte = static_cast<uint8_t>(in[(*pos)++]);
    // The tenth byte holds the top bit only.
    if (shift == 63 && byte > 1) return false;
    out |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) {
      *v = out;
      return true;
    }
  }
  return false;
}

std::string EncodeRuns(const std::vector<uint64_t>& blocks) {
  std::string out;
  size_t i = 0;
  while (i < blocks.size()) {
    const uint64_t first = blocks[i];
    uint64_t count = 1;
    while (i + count < blocks.size() && blocks[i + count - 1] != UINT64_MAX &&
           blocks[i + count] == blocks[i + count - 1] + 1)
      ++count;
    PutVarint(out, first);
    PutVarint(out, count);
    i += count;
  }
  return out;
}

Result<std::vector<uint64_t>> DecodeRuns(std::string_view runs, std::string_view field) {
  // First pass: check every run and bound the expanded count before allocating.
  size_t total = 0;
  size_t pos = 0;
  while (pos < runs.size()) {
    uint64_t first = 0, count = 0;
    if (!GetVarint(runs, &pos, &first) || !GetVarint(runs, &pos, &count))
      return Malformed(std::string(field) + ": a run is cut off");
    if (count == 0) return Malformed(std::string(field) + ": a run of no blocks");
    if (count > kMaxMessageBlocks - total)
      return Malformed(std::string(field) + ": more than " + std::to_string(kMaxMessageBlocks) +
                       " blocks");
    if (count - 1 > UINT64_MAX - first)
      return Malformed(std::string(field) + ": a run passes the largest block id");
    total += count;
  }
  std::vector<uint64_t> out;
  out.reserve(total);
  pos = 0;
  while (pos < runs.size()) {
    uint64_t first = 0, count = 0;
    (void)GetVarint(runs, &pos, &first);
    (void)GetVarint(runs, &pos, &count);
    for (uint64_t j = 0; j < count; ++j) out.push_back(first + j);
  }
  return out;
}

Result<uint32_t> UInt32(codec::ArrayReader& r, std::string_view field, uint64_t max) {
  FERRY_ASSIGN_OR_RETURN(uint64_t v, r.UInt(field));
  if (v > max) return Malformed(std::string(field) + " " + std::to_string(v) + " is out of range");
  return static_cast<uint32_t>(v);
}

Result<std::string> Str(codec::ArrayReader& r, std::string_view field, size_t min, size_t max) {
  FERRY_ASSIGN_OR_RETURN(std::string_view s, r.Bytes(field, max));
  if (s.size() < min) return Malformed(std::string(field) + " is empty");
  return std::string(s);
}

// The version comes first, alone, so that another version is named as such.
Status CheckVersion(codec::ArrayReader& r, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(uint64_t version, r.UInt("version"));
  if (version != kKvVersion)
    return Status(Code::kInvalidArgument, std::string(what) +
                                              " version: " + std::to_string(version) + " vs " +
                                              std::to_string(kKvVersion));
  return Status::Ok();
}

void PutWorker(codec::Writer& w, const WorkerId& id, uint32_t tp_size) {
  w.Str(id.instance);
  w.UInt(id.dp_rank);
  w.UInt(id.tp_rank);
  w.UInt(tp_size);
}

Status GetWorker(codec::ArrayReader& r, WorkerId* id, uint32_t* tp_size) {
  FERRY_ASSIGN_OR_RETURN(id->instance, Str(r, "instance", 1, kMaxNameBytes));
  FERRY_ASSIGN_OR_RETURN(id->dp_rank, UInt32(r, "dp_rank", UINT32_MAX));
  FERRY_ASSIGN_OR_RETURN(id->tp_rank, UInt32(r, "tp_rank", kMaxTpSize - 1));
  FERRY_ASSIGN_OR_RETURN(*tp_size, UInt32(r, "tp_size", kMaxTpSize));
  if (*tp_size == 0 || id->tp_rank >= *tp_size)
    return Malformed("tp_rank " + std::to_string(id->tp_rank) + " of tp_size " +
                     std::to_string(*tp_size));
  return Status::Ok();
}

}  // namespace

std::string_view MsgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kAllocation:
      return "allocation";
    case MsgType::kCompletion:
      return "completion";
    case MsgType::kWriteFailed:
      return "write_failed";
    case MsgType::kRelease:
      return "release";
    case MsgType::kAbort:
      return "abort";
    case MsgType::kAbortAck:
      return "abort_ack";
    case MsgType::kPing:
      return "ping";
    case MsgType::kReleaseAck:
      return "release_ack";
  }
  return "unknown";
}

// [version, type, request, instance, dp_rank, tp_rank, tp_size, block runs, num_tokens,
//  first_token, handshake, layers, [checksums], code, error]; every field is always present.
std::string Encode(const Message& m) {
  codec::Writer w;
  w.Array(kMessageFields);
  w.UInt(kKvVersion);
  w.UInt(static_cast<uint64_t>(m.type));
  w.Str(m.request);
  PutWorker(w, m.from, m.from_tp_size);
  w.Bin(EncodeRuns(m.blocks));
  w.UInt(m.num_tokens);
  w.UInt(m.first_token);
  w.Str(m.handshake);
  w.UInt(m.layers);
  w.Array(static_cast<uint32_t>(m.checksums.size()));
  for (uint64_t c : m.checksums) w.UInt(c);
  w.UInt(m.code);
  w.Str(m.error);
  return w.Take();
}

Result<Message> Decode(std::string_view bytes) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, WireLimits()));
  codec::ArrayReader r = reader.root();
  FERRY_RETURN_IF_ERROR(CheckVersion(r, "kv message"));
  if (r.size() != kMessageFields)
    return Malformed(std::to_string(r.size()) + " fields, not " + std::to_string(kMessageFields));
  Message m;
  FERRY_ASSIGN_OR_RETURN(uint64_t type, r.UInt("type"));
  if (type < static_cast<uint64_t>(MsgType::kAllocation) ||
      type > static_cast<uint64_t>(MsgType::kReleaseAck))
    return Malformed("unknown type " + std::to_string(type));
  m.type = static_cast<MsgType>(type);
  FERRY_ASSIGN_OR_RETURN(m.request,
                         Str(r, "request", m.type == MsgType::kPing ? 0 : 1, kMaxRequestIdBytes));
  FERRY_RETURN_IF_ERROR(GetWorker(r, &m.from, &m.from_tp_size));
  FERRY_ASSIGN_OR_RETURN(std::string_view runs, r.Bytes("blocks", kMaxRunBytes));
  FERRY_ASSIGN_OR_RETURN(m.blocks, DecodeRuns(runs, "blocks"));
  FERRY_ASSIGN_OR_RETURN(m.num_tokens, r.UInt("num_tokens"));
  FERRY_ASSIGN_OR_RETURN(m.first_token, r.UInt("first_token"));
  FERRY_ASSIGN_OR_RETURN(m.handshake, Str(r, "handshake", 0, kMaxAddressBytes));
  FERRY_ASSIGN_OR_RETURN(m.layers, UInt32(r, "layers", kMaxMessageLayers));
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader sums, r.Array("checksums", kMaxMessageLayers));
  // With checksums on there is one per layer of the model (0 for a layer not written), so at
  // least one per layer written; without, none.
  if (sums.size() != 0 && sums.size() < m.layers)
    return Malformed(std::to_string(sums.size()) + " checksums for " + std::to_string(m.layers) +
                     " layers");
  m.checksums.reserve(sums.size());
  while (!sums.done()) {
    FERRY_ASSIGN_OR_RETURN(uint64_t c, sums.UInt("checksum"));
    m.checksums.push_back(c);
  }
  // A Code value: its underlying type is one byte.
  FERRY_ASSIGN_OR_RETURN(m.code, UInt32(r, "code", std::numeric_limits<uint8_t>::max()));
  FERRY_ASSIGN_OR_RETURN(m.error, Str(r, "error", 0, kMaxErrorBytes));
  return m;
}

// ReadParams travel through the router, beside the connector's messages; the same bounds and
// the same block runs apply.
// [version, request, instance, dp_rank, tp_rank, producer_tp_size, handshake, block runs,
//  num_tokens]
std::string ReadParams::Pack() const {
  codec::Writer w;
  w.Array(kReadParamsFields);
  w.UInt(kKvVersion);
  w.Str(request);
  PutWorker(w, producer, producer_tp_size);
  w.Str(handshake);
  w.Bin(EncodeRuns(blocks));
  w.UInt(num_tokens);
  return w.Take();
}

Result<ReadParams> ReadParams::Unpack(std::string_view bytes) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, WireLimits()));
  codec::ArrayReader r = reader.root();
  FERRY_RETURN_IF_ERROR(CheckVersion(r, "read params"));
  if (r.size() != kReadParamsFields)
    return Malformed(std::to_string(r.size()) + " fields, not " +
                     std::to_string(kReadParamsFields));
  ReadParams p;
  FERRY_ASSIGN_OR_RETURN(p.request, Str(r, "request", 1, kMaxRequestIdBytes));
  FERRY_RETURN_IF_ERROR(GetWorker(r, &p.producer, &p.producer_tp_size));
  FERRY_ASSIGN_OR_RETURN(p.handshake, Str(r, "handshake", 0, kMaxAddressBytes));
  FERRY_ASSIGN_OR_RETURN(std::string_view runs, r.Bytes("blocks", kMaxRunBytes));
  FERRY_ASSIGN_OR_RETURN(p.blocks, DecodeRuns(runs, "blocks"));
  FERRY_ASSIGN_OR_RETURN(p.num_tokens, r.UInt("num_tokens"));
  return p;
}

}  // namespace ferry::kv
