#include "transport/region.h"

#include <algorithm>
#include <string>
#include <thread>

#include "base/log.h"

namespace ferry::internal {

void AccessDenials::Deny(std::string_view transport, std::string_view peer, RegionId region) {
  count_.fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    if (logged_.size() >= kMaxLogged) return;
    if (!logged_.emplace(std::string(peer), static_cast<uint64_t>(region)).second) return;
  }
  FERRY_LOG_WARN("{}: refused peer '{}' access to region {}: not on its access list (logged once per peer and region)",
                 transport, peer, static_cast<uint64_t>(region));
}

bool Region::Allows(std::string_view peer) const {
  return allowed_peers.empty() || std::binary_search(allowed_peers.begin(), allowed_peers.end(), peer);
}

bool Region::Admit(std::string_view transport, std::string_view peer) const {
  if (Allows(peer)) return true;
  if (denials) denials->Deny(transport, peer, id);
  return false;
}

bool Region::Acquire() {
  int64_t prev = state_.fetch_add(1, std::memory_order_acq_rel);
  if (prev & kDead) {
    state_.fetch_sub(1, std::memory_order_acq_rel);
    return false;
  }
  return true;
}

void Region::Release() { state_.fetch_sub(1, std::memory_order_acq_rel); }

Status Region::Retire(Deadline deadline) {
  state_.fetch_or(kDead, std::memory_order_acq_rel);
  auto backoff = std::chrono::microseconds(10);
  while ((state_.load(std::memory_order_acquire) & ~kDead) != 0) {
    if (deadline.expired()) {
      return Status(Code::kDeadlineExceeded,
                    "region " + std::to_string(static_cast<uint64_t>(id)) +
                        " is still in use by running transfers");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
  }
  return Status::Ok();
}

std::shared_ptr<RegionUse> RegionUse::Make(std::shared_ptr<Region> region) {
  if (!region || !region->Acquire()) return nullptr;
  return std::shared_ptr<RegionUse>(new RegionUse(std::move(region)));
}

}  // namespace ferry::internal
