// The `ucx` transport's active-message wire format: a fixed 64-byte little-endian header,
// decoded with every field checked. Every message names its connection: `conn` is the id the
// target gave it in ferry's handshake (door_wire.h), and the target takes the sender's
// identity from that connection, never from a message. Messages that reach a region carry
// its `key`, the secret of its descriptor. Messages:
//   kWrite    payload lands in the target's region `region` at `offset` (`size` bytes)
//   kReadReq  asks the target to send `size` bytes of `region` at `offset` back (kReadResp)
//   kReadResp payload: the bytes asked for by `token`
//   kAck      completes the sender's `token` with status `code` (0 = OK)
//   kNotify   payload: a notification's message for the target's inbox (EncodeNotify); the
//             sender is the connection's engine
//   kCheck    asks the target to confirm that `region` is registered at address `offset` with
//             `size` bytes, before the initiator uses its remote key for RMA
//   kRevoke   the target deregisters `region`: the initiator drops its remote key, completes
//             the RMA it posted, then acks
//   kStagedWrite, kStagedReadReq  GPU memory staged through bounce buffers (staged.h); their
//             payloads are encoded in staged_wire.h
// Type 1 was kHello, a handshake message that was never sent (the handshake is on ferry's own
// socket, door_wire.h); it is retired and decodes as an unknown type. The other types keep
// their numbers, so the version did not change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal::ucx {

inline constexpr uint16_t kAmId = 0x4652;  // one UCX AM id; the header says which message
// The version of the active-message header layout and of the message types above: byte 0 of
// every header. A receiver rejects a header of another version. (The handshake that precedes
// any active message has its own version, kDoorVersion.)
inline constexpr uint8_t kUcxAmVersion = 2;

enum class MsgType : uint8_t {
  // 1: retired (kHello, never sent); not to be reused.
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
  MsgType type = MsgType::kWrite;
  uint8_t code = 0;     // ferry::Code of an ack
  uint64_t token = 0;   // the sender's completion token (echoed in acks and read responses)
  uint64_t region = 0;  // target region id
  uint64_t offset = 0;  // offset inside the region
  uint64_t size = 0;    // bytes of data the message carries or asks for
  uint64_t conn = 0;    // the connection's id (door_wire.h)
  uint64_t key = 0;     // the target region's key (its descriptor's secret)
  uint8_t lane = 0;     // which of the connection's endpoints it came on (answers go back on it)
};

inline constexpr size_t kAmHeaderBytes = 64;

void EncodeHeader(const AmHeader& h, uint8_t out[kAmHeaderBytes]);
// kInvalidArgument on a header of the wrong length, version or type, or with a size that
// does not match the payload that came with it.
Result<AmHeader> DecodeHeader(const void* data, size_t length, size_t payload_length);

// kNotify's payload: the message's bytes, nothing else (the receiver knows the sender from the
// connection it came on). The header that goes with it has `size` = the payload's length.
std::string EncodeNotify(std::string_view message);
// The message carried by a kNotify message whose header `h` came with `length` bytes at
// `payload`. kInvalidArgument when `h` is not a kNotify, or the payload is absent, shorter
// (truncated) or longer than h.size says. The view points into `payload`.
Result<std::string_view> DecodeNotify(const AmHeader& h, const void* payload, size_t length);

}  // namespace ferry::internal::ucx
