// The `shm` transport's socket messages: a fixed 48-byte little-endian header and, for the
// messages that carry one, a payload of exactly `size` bytes, one message per SOCK_SEQPACKET
// record. Decoding checks every field; nothing from a peer is trusted.
//   kHello     initiator -> target after connecting; payload: the initiator's engine key
//   kOpen      asks for the memory file of `region`, registered at address `offset` with `size`
//              bytes, with the region's key in `extra` (from its descriptor); answered by kOpenReply
//   kOpenReply `code` 0: the region's memory file and the target's revocation table come
//              attached (SCM_RIGHTS, in that order); `offset` is where the region starts in
//              its file, `size` its slot in the table, `extra` its generation (revocation.h).
//              Otherwise nothing is attached, and `code` says why.
//   kRing      target -> initiator, once, in answer to kHello: `code` 0: the memory file of the
//              notification ring comes attached (ring.h); `size` is its capacity, `offset` the
//              largest notification the target takes. Otherwise nothing is attached.
//   kAck       completes the initiator's `token` with status `code` (a ring record that asked
//              for an answer: the notification of a write batch)
//   kRevoke    target -> initiator: `region` is being deregistered; stop, unmap, then kUnmapped
//   kUnmapped  initiator -> target: the initiator no longer maps `region`
//   kWake      initiator -> target: records wait in the ring and the target's I/O thread sleeps
//   kAuth      the deployment's secret proven both ways before the hello (EngineOptions::secret,
//              base/auth.h); `region` is the step. 0, initiator -> target: its nonce and engine
//              key. 1, target -> initiator: its nonce and proof, or `code` not 0 when it does not
//              authenticate. 2, initiator -> target: its proof. The hello must then name the key
//              of step 0.
// Notifications themselves travel in the ring, not over the socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/status.h"

namespace ferry::internal::shm {

// The version of the socket messages' header layout and types above: byte 0 of every header.
// A receiver rejects a message of another version. (The notification ring's layout has its
// own, kRingVersion in ring_format.h.)
inline constexpr uint8_t kShmWireVersion = 4;

// A region's `shm` descriptor data: the target's socket name, '#', and the region's key as 16
// hex digits.
std::string PackAccess(const std::string& socket_name, uint64_t key);
// kInvalidArgument when `data` is not of that form.
Result<std::pair<std::string, uint64_t>> UnpackAccess(std::string_view data);
// A random non-zero key (the system's entropy source).
uint64_t RegionKey();
inline constexpr size_t kHeaderBytes = 48;
// Largest payload any message may carry.
inline constexpr size_t kMaxPayloadBytes = 1 << 20;

enum class MsgType : uint8_t {
  kHello = 1,
  kOpen = 2,
  kOpenReply = 3,
  kRing = 4,
  kAck = 5,
  kRevoke = 6,
  kUnmapped = 7,
  kWake = 8,
  kAuth = 9,
};

struct Header {
  MsgType type = MsgType::kHello;
  uint8_t code = 0;     // ferry::Code of a reply
  uint64_t token = 0;   // the initiator's call token, echoed in the reply
  uint64_t region = 0;  // target region id
  uint64_t offset = 0;  // kOpen: the region's address; kOpenReply: its offset in the file;
                        // kRing: the largest notification
  uint64_t size = 0;    // kOpen: the region's bytes; kRing: the ring's capacity; payload bytes
                        // for kHello
  uint64_t extra = 0;   // kOpen: the region's key; kOpenReply: the region's generation
};

struct Message {
  Header header;
  std::string_view payload;  // points into the decoded bytes
};

// Header followed by `payload` (whose size must equal h.size for payload-carrying types).
std::string Encode(const Header& h, std::string_view payload = {});
// kInvalidArgument on a message of the wrong length, version, type or status code, with
// nonzero reserved bytes, or whose payload does not match its header.
Result<Message> Decode(const void* data, size_t length);
// The header alone, every field checked, whatever follows it (for a message cut short because
// it was longer than the receiver takes).
Result<Header> DecodeHeader(const void* data, size_t length);

}  // namespace ferry::internal::shm
