// Conn: a connection to one peer on one shard (core.h). Everything here but failure() runs
// holding the shard's worker (worker.h).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "base/log.h"
#include "transport/ucx/core.h"

namespace ferry::internal::ucx {

Status Conn::failure() const {
  MutexLock lock(&failure_mu_);
  if (failure_.ok()) return Status(Code::kUnavailable, "connection to peer " + peer_.key + " is closed");
  return failure_;
}

Conn::~Conn() {
  if (control_ >= 0) close(control_);
}

Status Conn::Open(int lanes) {
  if (shard_->conn_by_id.count(id_) != 0)
    return Status(Code::kFailedPrecondition, "peer " + peer_.key + " gave a connection id already in use here");
  for (int i = 0; i < lanes; ++i) {
    auto ep = OpenEndpoint(shard_->worker->handle(), worker_address_, &Conn::OnError, this);
    if (!ep.ok()) return ep.status().WithContext("connecting to " + peer_.key + " at " + address_);
    eps_.push_back(*ep);
  }
  shard_->conn_by_id[id_] = this;
  return Status::Ok();
}

void Conn::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* conn = static_cast<Conn*>(arg);
  conn->Fail(FromUcs(status, "connection to peer " + conn->peer_.key + " lost"));
}

void Conn::Fail(Status why) {
  if (failed_.exchange(true)) return;
  if (why.code() != Code::kAborted) why = Status(Code::kUnavailable, std::string(why.message()));
  {
    MutexLock lock(&failure_mu_);
    failure_ = why;
  }
  FERRY_LOG_INFO("ucx: {}", why.ToString());
  shard_->FailPending(this, 0, why);
  Close();
}

void Conn::Close() {
  for (auto& [id, keys] : rkeys_)
    for (ucp_rkey_h k : keys)
      if (k != nullptr) ucp_rkey_destroy(k);
  rkeys_.clear();
  for (ucp_ep_h ep : eps_) CloseEndpoint(ep);
  if (!eps_.empty()) {
    auto it = shard_->conn_by_id.find(id_);
    if (it != shard_->conn_by_id.end() && it->second == this) shard_->conn_by_id.erase(it);
  }
  eps_.clear();
  // The target forgets the connection when its control socket closes.
  if (control_ >= 0) {
    close(control_);
    control_ = -1;
  }
  failed_.store(true, std::memory_order_release);
}

void Conn::Revoke(uint64_t region) {
  revoked_.insert(region);
  auto it = rkeys_.find(region);
  if (it == rkeys_.end()) return;
  for (ucp_rkey_h k : it->second)
    if (k != nullptr) ucp_rkey_destroy(k);
  rkeys_.erase(it);
}

bool Conn::TargetClosed() {
  if (control_ < 0) return false;
  pollfd p{control_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  // Nothing else is sent on it after the welcome: bytes are drained, the end is the signal.
  char buf[64];
  const ssize_t n = recv(control_, buf, sizeof buf, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

Result<ucp_rkey_h> Conn::RemoteKey(const MemoryDesc& remote, size_t lane) {
  if (eps_.empty()) return failure();
  if (revoked_.count(static_cast<uint64_t>(remote.region)) != 0)
    return Status(Code::kFailedPrecondition, "remote region " +
                                                 std::to_string(static_cast<uint64_t>(remote.region)) +
                                                 " was deregistered");
  auto& keys = rkeys_[static_cast<uint64_t>(remote.region)];
  if (keys.empty()) keys.assign(eps_.size(), nullptr);
  lane %= eps_.size();
  if (keys[lane] == nullptr) {
    const TransportData* access = remote.FindAccess("ucx");
    if (access == nullptr) return Status(Code::kInvalidArgument, "remote region has no ucx key");
    FERRY_RETURN_IF_ERROR(AccessKey(remote).status());
    if (!HasRemoteKey(remote))
      return Status(Code::kInvalidArgument, "remote region " + std::to_string(static_cast<uint64_t>(remote.region)) +
                                                " has no remote key (active messages only)");
    ucs_status_t st = ucp_ep_rkey_unpack(eps_[lane], AccessRest(remote).data(), &keys[lane]);
    if (st != UCS_OK) return FromUcs(st, "unpacking the remote key");
  }
  return keys[lane];
}

}  // namespace ferry::internal::ucx
