#include "transport/shm/wire.h"

#include <cstdio>
#include <cstring>
#include <random>

#include "base/endian.h"

namespace ferry::internal::shm {
namespace {

Status Bad(const std::string& what) { return Status(Code::kInvalidArgument, "malformed shm message: " + what); }

bool CarriesPayload(MsgType t) { return t == MsgType::kHello || t == MsgType::kAuth; }

}  // namespace

// Layout: [0] version [1] type [2] code [3..7] zero [8] token [16] region [24] offset [32] size
// [40] extra.
std::string Encode(const Header& h, std::string_view payload) {
  std::string out(kHeaderBytes, '\0');
  out[0] = static_cast<char>(kShmWireVersion);
  out[1] = static_cast<char>(h.type);
  out[2] = static_cast<char>(h.code);
  StoreLe64(out.data() + 8, h.token);
  StoreLe64(out.data() + 16, h.region);
  StoreLe64(out.data() + 24, h.offset);
  StoreLe64(out.data() + 32, h.size);
  StoreLe64(out.data() + 40, h.extra);
  out.append(payload);
  return out;
}

Result<Header> DecodeHeader(const void* data, size_t length) {
  if (data == nullptr || length < kHeaderBytes) return Bad("message of " + std::to_string(length) + " bytes");
  const auto* p = static_cast<const uint8_t*>(data);
  if (p[0] != kShmWireVersion) return Bad("wire version " + std::to_string(p[0]));
  if (p[1] < static_cast<uint8_t>(MsgType::kHello) || p[1] > static_cast<uint8_t>(MsgType::kAuth))
    return Bad("unknown message type " + std::to_string(p[1]));
  for (int i = 3; i < 8; ++i)
    if (p[i] != 0) return Bad("reserved bytes are not zero");
  Header h;
  h.type = static_cast<MsgType>(p[1]);
  h.code = p[2];
  if (h.code > static_cast<uint8_t>(Code::kInProgress)) return Bad("unknown status code");
  h.token = LoadLe64(p + 8);
  h.region = LoadLe64(p + 16);
  h.offset = LoadLe64(p + 24);
  h.size = LoadLe64(p + 32);
  h.extra = LoadLe64(p + 40);
  if (h.type != MsgType::kOpenReply && h.type != MsgType::kAck && h.type != MsgType::kRing && h.type != MsgType::kAuth &&
      h.code != 0)
    return Bad("status code on a request");
  return h;
}

Result<Message> Decode(const void* data, size_t length) {
  Message m;
  FERRY_ASSIGN_OR_RETURN(m.header, DecodeHeader(data, length));
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t payload = length - kHeaderBytes;
  if (CarriesPayload(m.header.type)) {
    if (m.header.size != payload) return Bad("size does not match the payload");
    if (payload > kMaxPayloadBytes) return Bad("payload of " + std::to_string(payload) + " bytes");
    m.payload = std::string_view(reinterpret_cast<const char*>(p + kHeaderBytes), payload);
  } else if (payload != 0) {
    return Bad("unexpected payload");
  }
  return m;
}

std::string PackAccess(const std::string& socket_name, uint64_t key) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(key));
  return socket_name + "#" + hex;
}

Result<std::pair<std::string, uint64_t>> UnpackAccess(std::string_view data) {
  if (data.size() < 18 || data[data.size() - 17] != '#')
    return Status(Code::kInvalidArgument, "malformed shm access data");
  uint64_t key = 0;
  for (char c : data.substr(data.size() - 16)) {
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return Status(Code::kInvalidArgument, "malformed shm access data");
    key = key << 4 | static_cast<uint64_t>(v);
  }
  return std::make_pair(std::string(data.substr(0, data.size() - 17)), key);
}

uint64_t RegionKey() {
  std::random_device rd;
  for (;;) {
    uint64_t k = (uint64_t{rd()} << 32) ^ rd();
    if (k != 0) return k;
  }
}

}  // namespace ferry::internal::shm
