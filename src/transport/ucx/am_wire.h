// The `ucx` transport's active-message wire format: a fixed 48-byte little-endian header,
// decoded with every field checked. Messages:
//   kHello    client -> server after connecting; payload: the client's engine key
//   kWrite    payload lands in the target's region `region` at `offset` (`size` bytes)
//   kReadReq  asks the target to send `size` bytes of `region` at `offset` back (kReadResp)
//   kReadResp payload: the bytes asked for by `token`
//   kAck      completes the sender's `token` with status `code` (0 = OK)
//   kNotify   payload: a notification for the target's inbox
//   kCheck    asks the target to confirm that `region` is registered at address `offset` with
//             `size` bytes, before the initiator uses its remote key for RMA
//   kRevoke   the target deregisters `region`: the initiator drops its remote key, completes
//             the RMA it posted, then acks
//   kStagedWrite, kStagedReadReq  GPU memory staged through bounce buffers (staged.h)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal::ucx {

inline constexpr uint16_t kAmId = 0x4652;  // one UCX AM id; the header says which message
inline constexpr uint8_t kWireVersion = 1;

enum class MsgType : uint8_t {
  kHello = 1,
  kWrite = 2,
  kReadReq = 3,
  kReadResp = 4,
  kAck = 5,
  kNotify = 6,
  kCheck = 7,
  kRevoke = 8,
  kStagedWrite = 9,
  kStagedReadReq = 10,
};

struct AmHeader {
  MsgType type = MsgType::kHello;
  uint8_t code = 0;     // ferry::Code of an ack
  uint64_t token = 0;   // the sender's completion token (echoed in acks and read responses)
  uint64_t region = 0;  // target region id
  uint64_t offset = 0;  // offset inside the region
  uint64_t size = 0;    // bytes of data the message carries or asks for
};

inline constexpr size_t kAmHeaderBytes = 48;

void EncodeHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]);
// kInvalidArgument on a header of the wrong length, version or type, or with a size that
// does not match the payload that came with it.
Result<AmHeader> DecodeHeader(const void* data, size_t length, size_t payload_length);

}  // namespace ferry::internal::ucx
