// Core's authentication of peers (core.h, wire.h's kAuth): with EngineOptions::secret set, an
// initiator proves that it holds the secret, and checks that the target does, before its hello;
// a target refuses a hello that did not follow a valid proof. Both proofs are HMACs over both
// sides' fresh nonces and both engine keys (base/auth.h), so a recorded exchange cannot be
// replayed.
#include <poll.h>

#include "base/auth.h"
#include "base/log.h"
#include "transport/shm/core.h"

namespace ferry::internal::shm {
namespace {

constexpr std::string_view kProofLabel = "ferry shm";

std::string TargetProof(std::string_view secret, std::string_view nonce, std::string_view target_nonce,
                        std::string_view initiator, std::string_view target) {
  return auth::TargetProof(secret, kProofLabel, nonce, target_nonce, initiator, target);
}

std::string InitiatorProof(std::string_view secret, std::string_view nonce, std::string_view target_nonce,
                           std::string_view initiator, std::string_view target) {
  return auth::InitiatorProof(secret, kProofLabel, nonce, target_nonce, initiator, target);
}

}  // namespace

void Core::RefuseAuth(const std::shared_ptr<Conn>& conn, const std::string& why) {
  auth_failures_.fetch_add(1, std::memory_order_relaxed);
  Reject(why);
  const std::string& who = conn->auth().key.empty() ? conn->peer_key() : conn->auth().key;
  if (auth_logged_.size() < 1024 && auth_logged_.insert(who).second)
    FERRY_LOG_WARN("shm: peer '{}' failed authentication: {} (logged once per peer)", who, why);
  conn->set_auth_pending(false);  // counted here, not again when it is dropped
  // Said before the connection closes, where the initiator waits for it: as a refused ring.
  Header refusal;
  refusal.type = MsgType::kRing;
  refusal.code = static_cast<uint8_t>(Code::kPermissionDenied);
  (void)conn->TrySend(refusal);
  Drop(conn, Status(Code::kPermissionDenied, why));
}

void Core::HandleAuth(const std::shared_ptr<Conn>& conn, const Message& m) {
  Conn::Auth& a = conn->auth();
  if (m.header.region == 0 && a.nonce.empty() && !conn->hello_seen()) {
    Header reply;
    reply.type = MsgType::kAuth;
    reply.region = 1;
    if (secret_.empty()) {  // an initiator with a secret refuses a target without one
      reply.code = static_cast<uint8_t>(Code::kFailedPrecondition);
      (void)conn->Send(reply);
      return;
    }
    if (m.payload.size() <= auth::kNonceBytes || m.payload.size() > auth::kNonceBytes + kMaxKeyBytes)
      return RefuseAuth(conn, "a malformed authentication");
    a.nonce = std::string(m.payload.substr(0, auth::kNonceBytes));
    a.key = std::string(m.payload.substr(auth::kNonceBytes));
    auto nonce = auth::Nonce();
    if (!nonce.ok()) return Drop(conn, nonce.status());
    a.target = std::move(nonce).value();
    const std::string payload = a.target + TargetProof(secret_, a.nonce, a.target, a.key, engine_key_);
    reply.size = payload.size();
    conn->set_auth_pending(true);
    (void)conn->Send(reply, payload);
    return;
  }
  if (m.header.region == 2 && !a.nonce.empty() && !a.proven && !secret_.empty()) {
    if (!auth::MacEqual(m.payload, InitiatorProof(secret_, a.nonce, a.target, a.key, engine_key_)))
      return RefuseAuth(conn, "its proof of the deployment's secret is wrong (a different secret?)");
    a.proven = true;
    conn->set_auth_pending(false);
    return;
  }
  RefuseAuth(conn, "an authentication message out of order");
}

Status Core::Authenticate(Conn& conn, Deadline deadline) {
  FERRY_ASSIGN_OR_RETURN(std::string nonce, auth::Nonce());
  Header h;
  h.type = MsgType::kAuth;
  h.region = 0;
  h.size = nonce.size() + engine_key_.size();
  FERRY_RETURN_IF_ERROR(conn.Send(h, nonce + engine_key_));
  auto msg = os::WaitMessage(conn.fd(), deadline);
  if (!msg.ok()) return Status(Code::kUnavailable, "no answer to ferry's authentication: " + std::string(msg.status().message()));
  auto m = Decode(msg->bytes.data(), msg->bytes.size());
  if (!m.ok() || m->header.type != MsgType::kAuth || m->header.region != 1)
    return Status(Code::kPermissionDenied, "the target answered ferry's authentication with something else");
  if (m->header.code != 0)
    return Status(Code::kPermissionDenied, "the target does not authenticate its peers (it has no secret); this engine "
                                           "talks to authenticated peers only");
  if (m->payload.size() != auth::kNonceBytes + auth::kMacBytes)
    return Status(Code::kPermissionDenied, "a malformed challenge");
  const std::string target(m->payload.substr(0, auth::kNonceBytes));
  if (!auth::MacEqual(m->payload.substr(auth::kNonceBytes),
                      TargetProof(secret_, nonce, target, engine_key_, conn.peer_key())))
    return Status(Code::kPermissionDenied, "the target could not prove that it holds the deployment's secret "
                                           "(a different secret?)");
  Header proof;
  proof.type = MsgType::kAuth;
  proof.region = 2;
  const std::string mac = InitiatorProof(secret_, nonce, target, engine_key_, conn.peer_key());
  proof.size = mac.size();
  return conn.Send(proof, mac);
}

}  // namespace ferry::internal::shm
