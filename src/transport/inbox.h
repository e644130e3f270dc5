// Inbox: notifications received by one engine, in arrival order, with a bounded backlog.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/engine.h"

namespace ferry::internal {

class Inbox {
 public:
  Inbox(size_t max_pending, size_t max_bytes) : max_pending_(max_pending), max_bytes_(max_bytes) {}

  // kResourceExhausted when the backlog is full, kInvalidArgument when the message is too big.
  Status Push(Notification n) {
    if (n.message.size() > max_bytes_)
      return Status(Code::kInvalidArgument, "notification of " + std::to_string(n.message.size()) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(max_bytes_));
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.size() >= max_pending_)
      return Status(Code::kResourceExhausted, "the receiver's notification backlog is full");
    pending_.push_back(std::move(n));
    return Status::Ok();
  }

  std::vector<Notification> PopAll() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Notification> out(std::make_move_iterator(pending_.begin()),
                                  std::make_move_iterator(pending_.end()));
    pending_.clear();
    return out;
  }

  size_t max_bytes() const { return max_bytes_; }

 private:
  const size_t max_pending_;
  const size_t max_bytes_;
  std::mutex mu_;
  std::deque<Notification> pending_;  // GUARDED_BY(mu_)
};

}  // namespace ferry::internal
