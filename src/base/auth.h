// Peer authentication: a secret shared by the engines of one deployment, proven by each side
// of a connection with an HMAC-SHA256 over fresh nonces from both (OpenSSL's libcrypto; the
// secret itself never travels). Used by the transports' handshakes (e.g. the ucx door,
// door_wire.h): the target challenges with its nonce and its own proof over the initiator's
// nonce, the initiator checks it and answers with its proof over the target's nonce. A replayed
// proof fails, as the other side's nonce is new on every connection.
//
// Thread safety: free functions, safe from any thread.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256
// A secret shorter than this is refused (EngineOptions::secret): guessing must stay hopeless.
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;

// kNonceBytes from the system's entropy source; kInternal if it fails.
Result<std::string> Nonce();

// HMAC-SHA256 keyed by `secret` over `label` and each part, each prefixed by its length (so no
// two lists of parts give the same input).
std::string Mac(std::string_view secret, std::string_view label, std::initializer_list<std::string_view> parts);

// The two proofs of a handshake between engines `initiator` and `target` (their keys), over
// both nonces and both keys, so that a proof made for one pair of keys fails for any other:
// the key a target sees is the key the initiator proved the secret under. `label` names the
// transport's handshake ("ferry ucx door", "ferry shm"); each side's proof adds its role to it
// (": target", ": initiator"), so that neither proof can stand in for the other.
std::string TargetProof(std::string_view secret, std::string_view label, std::string_view initiator_nonce,
                        std::string_view target_nonce, std::string_view initiator, std::string_view target);
std::string InitiatorProof(std::string_view secret, std::string_view label, std::string_view initiator_nonce,
                           std::string_view target_nonce, std::string_view initiator, std::string_view target);

// Compares in time independent of where they differ.
bool MacEqual(std::string_view a, std::string_view b);

// The secret of EngineOptions: `secret` itself, or the contents of `secret_file` (trailing
// newlines dropped; the file must not be readable by group or others). Empty: no
// authentication. kInvalidArgument for a secret that is too short or long, both set, or an
// unreadable or too open file.
Result<std::string> LoadSecret(std::string_view secret, const std::string& secret_file);

}  // namespace ferry::internal::auth
