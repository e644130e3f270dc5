// EngineCore's peers and the connections to them: adding, removing and fencing peers, and the
// cache of endpoints (one per peer and transport) that sessions and notifications share, from
// which failed connections are replaced and dead ones let go.
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_core.h"

namespace ferry {
namespace internal {

Status EngineCore::AddPeer(const EngineDesc& peer) {
  if (closed()) return Status(Code::kAborted, "the engine was shut down");
  if (peer.key.empty()) return Status(Code::kInvalidArgument, "peer descriptor has no key");
  if (peer.protocol_version != kDescriptorVersion)
    return Status(Code::kFailedPrecondition, "peer speaks protocol " + std::to_string(peer.protocol_version));
  if (peer.key == options_.key) return Status::Ok();  // this engine reaches itself already
  {
    MutexLock lock(&mu_);
    peers_[peer.key] = peer;
    notify_endpoints_.erase(peer.key);
    ++peers_generation_;
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
      it = it->first.first == peer.key ? endpoints_.erase(it) : std::next(it);
    }
  }
  PruneDeadEndpoints();  // a peer that comes back as another engine leaves its old one dead
  return Status::Ok();
}

Status EngineCore::RemovePeer(std::string_view key) {
  MutexLock lock(&mu_);
  auto it = peers_.find(std::string(key));
  if (it == peers_.end()) return Status(Code::kNotFound, "peer " + std::string(key) + " is not known");
  peers_.erase(it);
  if (auto n = notify_endpoints_.find(key); n != notify_endpoints_.end()) notify_endpoints_.erase(n);
  ++peers_generation_;
  for (auto e = endpoints_.begin(); e != endpoints_.end();) {
    e = e->first.first == key ? endpoints_.erase(e) : std::next(e);
  }
  return Status::Ok();
}

Status EngineCore::FencePeer(std::string_view key, Duration timeout) {
  if (timeout <= Duration::zero()) return Status(Code::kInvalidArgument, "FencePeer needs a positive timeout");
  const Deadline deadline = Deadline::After(timeout);
  Status first;
  for (auto& t : transports_) {
    Status s = t->FencePeer(key, deadline);
    if (!s.ok() && first.ok()) first = s.WithContext(std::string(t->name()));
  }
  return first;
}

Result<EngineDesc> EngineCore::FindPeer(std::string_view key) {
  if (key == options_.key) return desc_;
  MutexLock lock(&mu_);
  auto it = peers_.find(std::string(key));
  if (it == peers_.end())
    return Status(Code::kFailedPrecondition, "peer " + std::string(key) + " was not added (AddPeer)");
  return it->second;
}

void EngineCore::PruneDeadEndpoints() {
  std::vector<std::shared_ptr<Endpoint>> dead;
  auto take = [&dead](auto& cache) {
    for (auto it = cache.begin(); it != cache.end();) {
      if (!it->second->dead()) {
        ++it;
        continue;
      }
      dead.push_back(std::move(it->second));
      it = cache.erase(it);
    }
  };
  MutexLock lock(&mu_);
  take(endpoints_);
  take(notify_endpoints_);
  // `dead` is declared before the lock: the endpoints close after mu_ is released.
}

Result<std::shared_ptr<Endpoint>> EngineCore::GetEndpoint(const EngineDesc& peer, size_t transport) {
  PruneDeadEndpoints();  // a new connection is a good time to let go of dead ones
  auto cache_key = std::make_pair(peer.key, transport);
  {
    MutexLock lock(&mu_);
    auto it = endpoints_.find(cache_key);
    if (it != endpoints_.end()) {
      if (it->second->healthy()) return it->second;
      endpoints_.erase(it);  // the connection failed: connect anew
    }
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> ep, transports_[transport]->Connect(peer));
  MutexLock lock(&mu_);
  auto [it, inserted] = endpoints_.emplace(cache_key, ep);
  if (!inserted && !it->second->healthy()) it->second = ep;
  return it->second;
}

}  // namespace internal
}  // namespace ferry
