#include "embed/service/staging.h"

#include <algorithm>
#include <bit>
#include <new>
#include <string>

#include "cuda/runtime.h"

namespace ferry::embed::service {

void Staging::Release() {
  if (pinned_) (void)cuda::HostUnregister(data_.get());
  pinned_ = false;
  data_.reset();
  if (held_ != nullptr) held_->fetch_sub(capacity_);
  capacity_ = 0;
}

Status Staging::Reserve(size_t bytes, size_t limit, bool pinned) {
  if (bytes <= capacity_ && (pinned_ || !pinned)) return Status::Ok();
  size_t want = std::max(capacity_, std::min(std::bit_ceil(std::max<size_t>(bytes, 4096)), limit));
  want = std::max(want, bytes);
  Release();
  // Default-initialised: large buffers come from fresh anonymous pages, touched only when rows
  // are gathered into them.
  data_.reset(new (std::nothrow) uint8_t[want]);
  if (data_ == nullptr)
    return Status(Code::kResourceExhausted,
                  "no memory for a staging buffer of " + std::to_string(want) + " bytes");
  capacity_ = want;
  if (held_ != nullptr) held_->fetch_add(capacity_);
  if (pinned) {
    Status s = cuda::HostRegister(data_.get(), capacity_);
    if (!s.ok()) {
      Release();
      return s.WithContext("page-locking the staging buffer");
    }
    pinned_ = true;
  }
  return Status::Ok();
}

}  // namespace ferry::embed::service
