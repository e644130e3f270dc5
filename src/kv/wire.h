// The connector's messages between workers: encoded as versioned msgpack, carried as engine
// notifications on kv::kTopic (or, for ReadParams, by the router), and decoded with every
// field bounded and checked (fuzzed: fuzz/kv_wire_fuzz.cc).
//
// Thread safety: pure functions on values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/kv.h"
#include "ferry/status.h"

namespace ferry::kv {

enum class MsgType : uint8_t {
  kAllocation = 1,   // consumer -> producer: R's destination blocks (write mode)
  kCompletion = 2,   // producer -> consumer: every layer of R is written (write mode)
  kWriteFailed = 3,  // producer -> consumer: R will not be written
  kRelease = 4,      // consumer -> producer: done reading R, free its blocks (read mode)
  kAbort = 5,        // consumer -> producer: stop writing R (write mode) / stop holding it
  kAbortAck = 6,     // producer -> consumer: no write of R is or will be in flight
  kPing = 7,         // liveness probe (no request)
  kReleaseAck = 8,   // producer -> consumer: R's blocks were held until the release (read mode);
                     // a release of R not held (any more) is answered with kWriteFailed
};
std::string_view MsgTypeName(MsgType type);

// Largest block list and checksum list a message carries.
inline constexpr size_t kMaxMessageBlocks = 1u << 20;
inline constexpr size_t kMaxMessageLayers = kMaxLayers;
inline constexpr size_t kMaxErrorBytes = 1024;
inline constexpr size_t kMaxAddressBytes = 256;

struct Message {
  MsgType type = MsgType::kPing;
  std::string request;   // empty only for kPing
  WorkerId from;         // the sender
  uint32_t from_tp_size = 1;
  // kAllocation: the consumer's blocks (encoded as runs of consecutive ids) and token count,
  // and the sender's handshake address for a producer that does not know it yet.
  std::vector<uint64_t> blocks;
  uint64_t num_tokens = 0;
  // kAllocation: the request's token that the first block holds (after the consumer's prefix
  // hit; the producer skips its blocks before it).
  uint64_t first_token = 0;
  std::string handshake;
  // kCompletion: layers written, the tokens moved and, with checksums on, one per layer of
  // the model (0 for a layer not written).
  uint32_t layers = 0;
  std::vector<uint64_t> checksums;
  // kWriteFailed / kAbort: why (a StatusCode value and a message).
  uint32_t code = 0;
  std::string error;
};

std::string Encode(const Message& message);
// kInvalidArgument for malformed input, another version, a type that is not known, a field
// out of its bounds, or a missing request id.
Result<Message> Decode(std::string_view bytes);

}  // namespace ferry::kv
