#include "transport/region.h"

#include <string>
#include <thread>

namespace ferry::internal {

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
