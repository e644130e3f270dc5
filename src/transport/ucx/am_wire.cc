#include "transport/ucx/am_wire.h"

#include <cstring>
#include <string>

namespace ferry::internal::ucx {
namespace {

void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
Status Bad(const std::string& what) {
  return Status(Code::kInvalidArgument, "malformed active message: " + what);
}

}  // namespace

// Layout: [0] version [1] type [2] code [3] lane [4..7] zero [8] token [16] region [24] offset
// [32] size [40] conn [48] key [56..63] zero.
void EncodeHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]) {
  std::memset(out, 0, kAmHeaderBytes);
  out[0] = kWireVersion;
  out[1] = static_cast<uint8_t>(h.type);
  out[2] = h.code;
  out[3] = h.lane;
  Put64(out + 8, h.token);
  Put64(out + 16, h.region);
  Put64(out + 24, h.offset);
  Put64(out + 32, h.size);
  Put64(out + 40, h.conn);
  Put64(out + 48, h.key);
}

Result<AmHeader> DecodeHeader(const void* data, size_t length, size_t payload_length) {
  if (data == nullptr || length != kAmHeaderBytes)
    return Bad("header of " + std::to_string(length) + " bytes");
  const auto* p = static_cast<const uint8_t*>(data);
  if (p[0] != kWireVersion) return Bad("wire version " + std::to_string(p[0]));
  AmHeader h;
  uint8_t type = p[1];
  if (type < static_cast<uint8_t>(MsgType::kHello) || type > static_cast<uint8_t>(MsgType::kStagedReadReq))
    return Bad("unknown message type " + std::to_string(type));
  h.type = static_cast<MsgType>(type);
  h.code = p[2];
  if (h.code > static_cast<uint8_t>(Code::kInProgress)) return Bad("unknown status code");
  h.token = Get64(p + 8);
  h.region = Get64(p + 16);
  h.offset = Get64(p + 24);
  h.size = Get64(p + 32);
  h.conn = Get64(p + 40);
  h.key = Get64(p + 48);
  h.lane = p[3];
  for (int i = 4; i < 8; ++i)
    if (p[i] != 0) return Bad("reserved bytes set");
  for (int i = 56; i < 64; ++i)
    if (p[i] != 0) return Bad("reserved bytes set");
  if (h.conn == 0) return Bad("no connection id");
  switch (h.type) {
    case MsgType::kWrite:
    case MsgType::kReadResp:
    case MsgType::kHello:
    case MsgType::kNotify:
    case MsgType::kStagedWrite:
    case MsgType::kStagedReadReq:
      if (h.size != payload_length) return Bad("size does not match the payload");
      break;
    case MsgType::kReadReq:
    case MsgType::kAck:
    case MsgType::kCheck:
    case MsgType::kRevoke:
      if (payload_length != 0) return Bad("unexpected payload");
      break;
  }
  return h;
}

}  // namespace ferry::internal::ucx
