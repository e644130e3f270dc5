// Inbox: notifications received by one engine, in arrival order, with a backlog bounded by
// count and by the bytes of its messages.
// Every notification it refuses (backlog full, too big) is counted, so that a refusal the
// sender did not wait to hear about (one-way notifications) is still visible at the receiver.
//
// Thread safety: all methods may be called from any thread. PopAll() on an empty inbox takes
// no lock (an application thread may poll it in a loop without slowing the transports that
// push into it).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class Inbox {
 public:
  // `max_pending` notifications of at most `max_bytes` each, together at most
  // `max_pending_bytes`.
  Inbox(size_t max_pending, size_t max_bytes, size_t max_pending_bytes = SIZE_MAX)
      : max_pending_(max_pending), max_bytes_(max_bytes), max_pending_bytes_(max_pending_bytes) {}

  // kResourceExhausted when the backlog is full (by count or by bytes), kInvalidArgument when
  // the message is too big.
  Status Push(Notification n) {
    if (n.message.size() > max_bytes_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kInvalidArgument, "notification of " + std::to_string(n.message.size()) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(max_bytes_));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.size() >= max_pending_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kResourceExhausted, "the receiver's notification backlog is full (" +
                                                  std::to_string(max_pending_) + " notifications)");
    }
    if (n.message.size() > max_pending_bytes_ - pending_bytes_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kResourceExhausted, "the receiver's notification backlog is full (" +
                                                  std::to_string(pending_bytes_) + " of " +
                                                  std::to_string(max_pending_bytes_) + " bytes)");
    }
    pending_bytes_ += n.message.size();
    pending_.push_back(std::move(n));
    size_.store(pending_.size(), std::memory_order_release);
    return Status::Ok();
  }

  std::vector<Notification> PopAll() {
    if (size_.load(std::memory_order_acquire) == 0) return {};
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Notification> out(std::make_move_iterator(pending_.begin()),
                                  std::make_move_iterator(pending_.end()));
    pending_.clear();
    pending_bytes_ = 0;
    size_.store(0, std::memory_order_release);
    return out;
  }

  size_t max_bytes() const { return max_bytes_; }
  size_t max_pending() const { return max_pending_; }
  size_t max_pending_bytes() const { return max_pending_bytes_; }
  // Notifications refused since the inbox was made.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  const size_t max_pending_;
  const size_t max_bytes_;
  const size_t max_pending_bytes_;
  std::mutex mu_;
  std::deque<Notification> pending_;  // GUARDED_BY(mu_)
  size_t pending_bytes_ = 0;          // GUARDED_BY(mu_): bytes of pending_'s messages
  std::atomic<size_t> size_{0};       // pending_.size(), written under mu_
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace ferry::internal
