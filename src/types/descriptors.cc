// Wire encoding of MemoryDesc and EngineDesc: a msgpack array that starts with a magic string
// and the protocol version, then the fields in a fixed order.
#include "ferry/descriptors.h"

#include "base/codec.h"

namespace ferry {
namespace {

constexpr std::string_view kMemoryMagic = "ferry.mem";
constexpr std::string_view kEngineMagic = "ferry.engine";
constexpr size_t kMaxNameBytes = 64;
constexpr int64_t kMaxDevice = 4096;

codec::Limits DescriptorLimits() {
  codec::Limits limits;
  limits.max_bytes = kMaxDescriptorBytes;
  limits.max_array = 64;
  limits.max_str = kMaxTransportDataBytes;
  limits.max_depth = 4;
  return limits;
}

void PackTransports(codec::Writer& w, const std::vector<TransportData>& entries) {
  w.Array(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    w.Array(2);
    w.Str(e.transport);
    w.Bin(e.data);
  }
}

Result<std::vector<TransportData>> UnpackTransports(codec::ArrayReader& r) {
  FERRY_ASSIGN_OR_RETURN(codec::ArrayReader list, r.Array("transports", kMaxTransportEntries));
  std::vector<TransportData> out;
  out.reserve(list.size());
  while (!list.done()) {
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader entry, list.Array("transport entry", 2));
    FERRY_ASSIGN_OR_RETURN(std::string_view name, entry.Bytes("transport name", kMaxNameBytes));
    FERRY_ASSIGN_OR_RETURN(std::string_view data, entry.Bytes("transport data", kMaxTransportDataBytes));
    if (name.empty()) return Status(Code::kInvalidArgument, "malformed descriptor: empty transport name");
    out.push_back(TransportData{std::string(name), std::string(data)});
  }
  return out;
}

Status CheckHeader(codec::ArrayReader& r, std::string_view magic) {
  FERRY_ASSIGN_OR_RETURN(std::string_view got, r.Bytes("magic", 32));
  if (got != magic)
    return Status(Code::kInvalidArgument, "not a " + std::string(magic) + " descriptor");
  FERRY_ASSIGN_OR_RETURN(uint64_t version, r.UInt("version"));
  if (version != kDescriptorVersion)
    return Status(Code::kInvalidArgument, "descriptor protocol version " + std::to_string(version) +
                                              " is not supported (this build speaks " +
                                              std::to_string(kDescriptorVersion) + ")");
  return Status::Ok();
}

Result<std::string> Key(codec::ArrayReader& r, std::string_view field, bool allow_empty) {
  FERRY_ASSIGN_OR_RETURN(std::string_view key, r.Bytes(field, kMaxKeyBytes));
  if (key.empty() && !allow_empty)
    return Status(Code::kInvalidArgument, "malformed descriptor: empty " + std::string(field));
  return std::string(key);
}

// The frame both descriptors share: [magic, version, fields..., transport entries]; `put`
// writes the `fields` fields between.
template <typename Fields>
std::string PackFrame(std::string_view magic, uint64_t version, uint32_t fields,
                      const std::vector<TransportData>& transports, Fields&& put) {
  codec::Writer w;
  w.Array(fields + 3);
  w.Str(magic);
  w.UInt(version);
  put(w);
  PackTransports(w, transports);
  return w.Take();
}

// Reads the frame: `get` reads the fields between the header and the transport entries, which
// go to d.*transports; nothing may follow them.
template <typename D, typename Fields>
Result<D> UnpackFrame(std::string_view bytes, std::string_view magic,
                      std::vector<TransportData> D::*transports, Fields&& get) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, codec::Reader::Parse(bytes, DescriptorLimits()));
  codec::ArrayReader r = reader.root();
  FERRY_RETURN_IF_ERROR(CheckHeader(r, magic));
  D d;
  FERRY_RETURN_IF_ERROR(get(r, d));
  FERRY_ASSIGN_OR_RETURN(d.*transports, UnpackTransports(r));
  if (!r.done()) return Status(Code::kInvalidArgument, "malformed descriptor: extra fields");
  return d;
}

const TransportData* Find(const std::vector<TransportData>& v, std::string_view name) {
  for (const auto& e : v)
    if (e.transport == name) return &e;
  return nullptr;
}

}  // namespace

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kCuda: return "cuda";
  }
  return "unknown";
}

const TransportData* MemoryDesc::FindAccess(std::string_view transport) const {
  return Find(access, transport);
}

const TransportData* EngineDesc::FindTransport(std::string_view transport) const {
  return Find(transports, transport);
}

std::string MemoryDesc::Pack() const {
  return PackFrame(kMemoryMagic, kDescriptorVersion, 7, access, [&](codec::Writer& w) {
    w.Str(engine_key);
    w.UInt(static_cast<uint64_t>(region));
    w.UInt(address);
    w.UInt(size);
    w.UInt(static_cast<uint64_t>(kind));
    w.Int(device);
    w.Str(host_id);
  });
}

Result<MemoryDesc> MemoryDesc::Unpack(std::string_view bytes) {
  return UnpackFrame(bytes, kMemoryMagic, &MemoryDesc::access,
                     [](codec::ArrayReader& r, MemoryDesc& d) -> Status {
    FERRY_ASSIGN_OR_RETURN(d.engine_key, Key(r, "engine key", false));
    FERRY_ASSIGN_OR_RETURN(uint64_t region, r.UInt("region"));
    d.region = static_cast<RegionId>(region);
    FERRY_ASSIGN_OR_RETURN(d.address, r.UInt("address"));
    FERRY_ASSIGN_OR_RETURN(d.size, r.UInt("size"));
    if (d.size > UINT64_MAX - d.address)
      return Status(Code::kInvalidArgument, "malformed descriptor: region wraps around the address space");
    FERRY_ASSIGN_OR_RETURN(uint64_t kind, r.UInt("kind"));
    if (kind > static_cast<uint64_t>(MemoryKind::kCuda))
      return Status(Code::kInvalidArgument, "malformed descriptor: unknown memory kind " + std::to_string(kind));
    d.kind = static_cast<MemoryKind>(kind);
    FERRY_ASSIGN_OR_RETURN(int64_t device, r.Int("device"));
    if (device < -1 || device > kMaxDevice)
      return Status(Code::kInvalidArgument, "malformed descriptor: device " + std::to_string(device));
    if ((d.kind == MemoryKind::kCuda) != (device >= 0))
      return Status(Code::kInvalidArgument, "malformed descriptor: device does not match memory kind");
    d.device = static_cast<int32_t>(device);
    FERRY_ASSIGN_OR_RETURN(d.host_id, Key(r, "host id", true));
    return Status::Ok();
  });
}

std::string EngineDesc::Pack() const {
  return PackFrame(kEngineMagic, protocol_version, 4, transports, [&](codec::Writer& w) {
    w.Str(key);
    w.Str(host_id);
    w.UInt(pid);
    w.Array(static_cast<uint32_t>(addresses.size()));
    for (const auto& a : addresses) w.Str(a);
  });
}

Result<EngineDesc> EngineDesc::Unpack(std::string_view bytes) {
  return UnpackFrame(bytes, kEngineMagic, &EngineDesc::transports,
                     [](codec::ArrayReader& r, EngineDesc& d) -> Status {
    FERRY_ASSIGN_OR_RETURN(d.key, Key(r, "engine key", false));
    FERRY_ASSIGN_OR_RETURN(d.host_id, Key(r, "host id", true));
    FERRY_ASSIGN_OR_RETURN(uint64_t pid, r.UInt("pid"));
    if (pid > UINT32_MAX) return Status(Code::kInvalidArgument, "malformed descriptor: pid out of range");
    d.pid = static_cast<uint32_t>(pid);
    FERRY_ASSIGN_OR_RETURN(codec::ArrayReader addresses, r.Array("addresses", kMaxAddresses));
    while (!addresses.done()) {
      FERRY_ASSIGN_OR_RETURN(std::string_view a, addresses.Bytes("address", kMaxKeyBytes));
      d.addresses.emplace_back(a);
    }
    return Status::Ok();
  });
}

}  // namespace ferry
