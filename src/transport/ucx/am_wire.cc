#include "transport/ucx/am_wire.h"

#include <cstring>
#include <string>

#include "base/endian.h"

namespace ferry::internal::ucx {
namespace {

Status Bad(const std::string& what) {
  return Status(Code::kInvalidArgument, "malformed active message: " + what);
}

}  // namespace

// Layout: [0] version [1] type [2] code [3] lane [4..7] zero [8] token [16] region [24] offset
// [32] size [40] conn [48] key [56..63] zero.
void EncodeHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]) {
  std::memset(out, 0, kAmHeaderBytes);
  out[0] = kUcxAmVersion;
  out[1] = static_cast<uint8_t>(h.type);
  out[2] = h.code;
  out[3] = h.lane;
  StoreLe64(out + 8, h.token);
  StoreLe64(out + 16, h.region);
  StoreLe64(out + 24, h.offset);
  StoreLe64(out + 32, h.size);
  StoreLe64(out + 40, h.conn);
  StoreLe64(out + 48, h.key);
}

Result<AmHeader> DecodeHeader(const void* data, size_t length, size_t payload_length) {
  if (data == nullptr || length != kAmHeaderBytes)
    return Bad("header of " + std::to_string(length) + " bytes");
  const auto* p = static_cast<const uint8_t*>(data);
  if (p[0] != kUcxAmVersion) return Bad("wire version " + std::to_string(p[0]));
  AmHeader h;
  uint8_t type = p[1];
  if (type < static_cast<uint8_t>(MsgType::kWrite) || type > static_cast<uint8_t>(MsgType::kStagedReadReq))
    return Bad("unknown message type " + std::to_string(type));
  h.type = static_cast<MsgType>(type);
  h.code = p[2];
  if (h.code > static_cast<uint8_t>(Code::kInProgress)) return Bad("unknown status code");
  h.token = LoadLe64(p + 8);
  h.region = LoadLe64(p + 16);
  h.offset = LoadLe64(p + 24);
  h.size = LoadLe64(p + 32);
  h.conn = LoadLe64(p + 40);
  h.key = LoadLe64(p + 48);
  h.lane = p[3];
  for (int i = 4; i < 8; ++i)
    if (p[i] != 0) return Bad("reserved bytes set");
  for (int i = 56; i < 64; ++i)
    if (p[i] != 0) return Bad("reserved bytes set");
  if (h.conn == 0) return Bad("no connection id");
  switch (h.type) {
    case MsgType::kWrite:
    case MsgType::kReadResp:
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

std::string EncodeNotify(std::string_view message) { return std::string(message); }

Result<std::string_view> DecodeNotify(const AmHeader& h, const void* payload, size_t length) {
  if (h.type != MsgType::kNotify) return Bad("not a notification");
  if (payload == nullptr && length != 0) return Bad("notification without its payload");
  if (length < h.size) return Bad("notification of " + std::to_string(length) + " bytes, truncated from " + std::to_string(h.size));
  if (length > h.size) return Bad("notification of " + std::to_string(length) + " bytes, longer than its header's " + std::to_string(h.size));
  if (length == 0) return std::string_view();
  return std::string_view(static_cast<const char*>(payload), length);
}

}  // namespace ferry::internal::ucx
