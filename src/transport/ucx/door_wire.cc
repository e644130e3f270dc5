#include "transport/ucx/door_wire.h"

#include <cstring>

#include "base/auth.h"
#include "base/codec.h"
#include "base/endian.h"
#include "ferry/descriptors.h"

namespace ferry::internal::ucx {
namespace {

Status Bad(const std::string& what) { return Status(Code::kInvalidArgument, "malformed ferry handshake: " + what); }

std::string Frame(std::string body) {
  std::string out(kDoorPrefixBytes, '\0');
  const uint32_t length = static_cast<uint32_t>(kDoorPrefixBytes + body.size());
  StoreLe32(out.data(), length);
  std::memcpy(out.data() + 4, kDoorMagic, sizeof(kDoorMagic));
  StoreLe16(out.data() + 12, kDoorVersion);
  out += body;
  return out;
}

Result<codec::Reader> Body(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(size_t length, DoorFrameLength(frame));
  if (length == 0 || length != frame.size()) return Bad("frame of " + std::to_string(frame.size()) + " bytes, prefix says " +
                                         std::to_string(length));
  codec::Limits limits;
  limits.max_bytes = kMaxDoorFrame;
  limits.max_array = 8;
  limits.max_depth = 1;
  auto reader = codec::Reader::Parse(frame.substr(kDoorPrefixBytes), limits);
  if (!reader.ok()) return Bad(std::string(reader.status().message()));
  return reader;
}

}  // namespace

std::string EncodeHello(const Hello& h) {
  codec::Writer w;
  w.Array(5);
  w.Str(h.from_key);
  w.Str(h.to_key);
  w.UInt(h.lanes);
  w.Bin(h.worker_address);
  w.Bin(h.nonce);
  return Frame(w.Take());
}

std::string EncodeChallenge(const Challenge& c) {
  codec::Writer w;
  w.Array(2);
  w.Bin(c.nonce);
  w.Bin(c.mac);
  return Frame(w.Take());
}

std::string EncodeProof(const Proof& p) {
  codec::Writer w;
  w.Array(1);
  w.Bin(p.mac);
  return Frame(w.Take());
}

constexpr std::string_view kProofLabel = "ferry ucx door";

std::string TargetProof(std::string_view secret, const Hello& hello, std::string_view target_nonce) {
  return auth::TargetProof(secret, kProofLabel, hello.nonce, target_nonce, hello.from_key, hello.to_key);
}

std::string InitiatorProof(std::string_view secret, const Hello& hello, std::string_view target_nonce) {
  return auth::InitiatorProof(secret, kProofLabel, hello.nonce, target_nonce, hello.from_key, hello.to_key);
}

Result<size_t> DoorFrameFields(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, Body(frame));
  return size_t{reader.root().size()};
}

Result<Challenge> DecodeChallenge(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, Body(frame));
  codec::ArrayReader a = reader.root();
  if (a.size() != 2) return Bad("challenge of " + std::to_string(a.size()) + " fields");
  FERRY_ASSIGN_OR_RETURN(std::string_view nonce, a.Bytes("nonce", auth::kNonceBytes));
  FERRY_ASSIGN_OR_RETURN(std::string_view mac, a.Bytes("proof", auth::kMacBytes));
  if (nonce.size() != auth::kNonceBytes) return Bad("a nonce of " + std::to_string(nonce.size()) + " bytes");
  if (mac.size() != auth::kMacBytes) return Bad("a proof of " + std::to_string(mac.size()) + " bytes");
  return Challenge{std::string(nonce), std::string(mac)};
}

Result<Proof> DecodeProof(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, Body(frame));
  codec::ArrayReader a = reader.root();
  if (a.size() != 1) return Bad("proof of " + std::to_string(a.size()) + " fields");
  FERRY_ASSIGN_OR_RETURN(std::string_view mac, a.Bytes("proof", auth::kMacBytes));
  if (mac.size() != auth::kMacBytes) return Bad("a proof of " + std::to_string(mac.size()) + " bytes");
  return Proof{std::string(mac)};
}

std::string EncodeWelcome(const Welcome& wl) {
  codec::Writer w;
  w.Array(5);
  w.UInt(static_cast<uint64_t>(wl.code));
  w.Str(wl.message.substr(0, 1024));
  w.Str(wl.key);
  w.UInt(wl.conn_id);
  w.Bin(wl.worker_address);
  return Frame(w.Take());
}

Result<size_t> DoorFrameLength(std::string_view prefix) {
  if (prefix.size() >= 4) {
    const uint32_t length = LoadLe32(prefix.data());
    if (length <= kDoorPrefixBytes || length > kMaxDoorFrame) return Bad("frame length " + std::to_string(length));
  }
  const size_t magic = std::min(prefix.size() > 4 ? prefix.size() - 4 : 0, sizeof(kDoorMagic));
  if (std::memcmp(prefix.data() + 4, kDoorMagic, magic) != 0) return Bad("not a ferry engine (bad magic)");
  if (prefix.size() < kDoorPrefixBytes) return size_t{0};
  const uint16_t version = LoadLe16(prefix.data() + 12);
  if (version != kDoorVersion)
    return Status(Code::kFailedPrecondition, "ferry handshake version " + std::to_string(version) + ", this engine speaks " +
                                                 std::to_string(kDoorVersion));
  return size_t{LoadLe32(prefix.data())};
}

Result<Hello> DecodeHello(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, Body(frame));
  codec::ArrayReader a = reader.root();
  if (a.size() != 5) return Bad("hello of " + std::to_string(a.size()) + " fields");
  Hello h;
  FERRY_ASSIGN_OR_RETURN(std::string_view from, a.Bytes("from key", kMaxKeyBytes));
  FERRY_ASSIGN_OR_RETURN(std::string_view to, a.Bytes("to key", kMaxKeyBytes));
  FERRY_ASSIGN_OR_RETURN(uint64_t lanes, a.UInt("lanes"));
  FERRY_ASSIGN_OR_RETURN(std::string_view address, a.Bytes("worker address", kMaxWorkerAddressBytes));
  FERRY_ASSIGN_OR_RETURN(std::string_view nonce, a.Bytes("nonce", auth::kNonceBytes));
  if (!nonce.empty() && nonce.size() != auth::kNonceBytes) return Bad("a nonce of " + std::to_string(nonce.size()) + " bytes");
  h.nonce = nonce;
  if (from.empty()) return Bad("empty engine key");
  if (lanes < 1 || lanes > kMaxDoorLanes) return Bad(std::to_string(lanes) + " lanes");
  if (address.empty()) return Bad("empty worker address");
  h.from_key = from;
  h.to_key = to;
  h.lanes = static_cast<uint16_t>(lanes);
  h.worker_address = address;
  return h;
}

Result<Welcome> DecodeWelcome(std::string_view frame) {
  FERRY_ASSIGN_OR_RETURN(codec::Reader reader, Body(frame));
  codec::ArrayReader a = reader.root();
  if (a.size() != 5) return Bad("welcome of " + std::to_string(a.size()) + " fields");
  Welcome w;
  FERRY_ASSIGN_OR_RETURN(uint64_t code, a.UInt("code"));
  FERRY_ASSIGN_OR_RETURN(std::string_view message, a.Bytes("message", 1024));
  FERRY_ASSIGN_OR_RETURN(std::string_view key, a.Bytes("key", kMaxKeyBytes));
  FERRY_ASSIGN_OR_RETURN(uint64_t conn_id, a.UInt("connection id"));
  FERRY_ASSIGN_OR_RETURN(std::string_view address, a.Bytes("worker address", kMaxWorkerAddressBytes));
  if (code > static_cast<uint64_t>(Code::kInProgress)) return Bad("status code " + std::to_string(code));
  w.code = static_cast<Code>(code);
  w.message = message;
  w.key = key;
  w.conn_id = conn_id;
  w.worker_address = address;
  if (w.code == Code::kOk && (w.conn_id == 0 || w.worker_address.empty()))
    return Bad("an accepted connection with no id or worker address");
  return w;
}

}  // namespace ferry::internal::ucx
