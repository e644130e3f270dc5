// The `ucx` transport's handshake, on ferry's own TCP socket (door.h) before any UCX endpoint
// exists: the initiator shows it is a ferry engine and says who it is and whom it wants; the
// target answers with the connection's id and the address of the UCX worker to reach. Frames
// are [u32 little-endian length][8-byte magic "FERRYUCX"][u16 version][msgpack body]
// (base/codec.h), each at most kMaxDoorFrame bytes; decoding checks every field.
//   Hello     [from key, to key, lanes, initiator's worker address, initiator's nonce]
//   Welcome   [code, message, target's key, connection id, target's worker address]
// A target with a secret (EngineOptions::secret; base/auth.h) answers a hello with
//   Challenge [target's nonce, target's proof]
// and the initiator, once it checked the target's proof, sends
//   Proof     [initiator's proof]
// before the welcome. The nonce is empty from an initiator without a secret. A Challenge has 2
// fields and a Welcome 5: what follows a hello is told apart by that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal::ucx {

inline constexpr char kDoorMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'U', 'C', 'X'};
// The version of the handshake's frames (prefix and bodies); the active messages that follow
// have their own, kUcxAmVersion (am_wire.h).
inline constexpr uint16_t kDoorVersion = 2;
// Length prefix + magic + version.
inline constexpr size_t kDoorPrefixBytes = 4 + sizeof(kDoorMagic) + 2;
inline constexpr size_t kMaxDoorFrame = 64 * 1024;
// A UCX worker address (ucp_worker_get_address): a few hundred bytes over TCP and shared
// memory, more with many RDMA devices.
inline constexpr size_t kMaxWorkerAddressBytes = 32 * 1024;
inline constexpr int kMaxDoorLanes = 64;

struct Hello {
  std::string from_key;        // the initiator's engine key
  std::string to_key;          // the engine key the initiator expects to reach
  uint16_t lanes = 1;          // endpoints the initiator opens (1..kMaxDoorLanes)
  std::string worker_address;  // where the target's answers go
  std::string nonce;           // auth::kNonceBytes, or empty (no secret here)
};

struct Challenge {
  std::string nonce;  // the target's, auth::kNonceBytes
  std::string mac;    // TargetProof(): the target holds the secret
};

struct Proof {
  std::string mac;  // InitiatorProof()
};

// The proofs, over both nonces and both keys, each side's with its own label.
std::string TargetProof(std::string_view secret, const Hello& hello, std::string_view target_nonce);
std::string InitiatorProof(std::string_view secret, const Hello& hello, std::string_view target_nonce);

struct Welcome {
  Code code = Code::kOk;       // not OK: refused, and `message` says why
  std::string message;
  std::string key;             // the target's engine key
  uint64_t conn_id = 0;        // names the connection in every message on it (am_wire.h); never 0
  std::string worker_address;  // the target's worker to open endpoints to
};

// Whole frames, length prefix included.
std::string EncodeHello(const Hello& h);
std::string EncodeWelcome(const Welcome& w);
std::string EncodeChallenge(const Challenge& c);
std::string EncodeProof(const Proof& p);

// The frame's total length once its first kDoorPrefixBytes are in: kInvalidArgument for a bad
// magic, version or length. `prefix` may be shorter; then 0 while what is there is plausible.
Result<size_t> DoorFrameLength(std::string_view prefix);

// A whole frame (as DoorFrameLength measured it). kInvalidArgument on anything malformed.
Result<Hello> DecodeHello(std::string_view frame);
Result<Welcome> DecodeWelcome(std::string_view frame);
Result<Challenge> DecodeChallenge(std::string_view frame);
Result<Proof> DecodeProof(std::string_view frame);
// The number of fields of a whole frame's body (a Challenge or a Welcome after a hello).
Result<size_t> DoorFrameFields(std::string_view frame);

}  // namespace ferry::internal::ucx
