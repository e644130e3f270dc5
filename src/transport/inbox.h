// Inbox: notifications received by one engine, sorted by topic, each topic in arrival order,
// with one backlog over every topic bounded by count and by the bytes of their messages, and
// each sending peer (Notification::from) bounded to a share of that count, so that one peer
// that floods the engine cannot fill the backlog and starve the others.
// A received message carries its topic in a notification frame (transport/notify_frame.h);
// the inbox decodes it, drops a malformed one and counts it (rejected()). Every notification it
// refuses (backlog full, too big) is counted (dropped()), so that a refusal the sender did not
// wait to hear about (one-way notifications) is still visible at the receiver.
//
// Thread safety: all methods may be called from any thread. PopAll() on an empty inbox takes
// no lock (an application thread may poll it in a loop without slowing the transports that
// push into it).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/mutex.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "transport/notify_frame.h"

namespace ferry::internal {

class Inbox {
 public:
  // `max_pending` notifications of at most `max_bytes` each (their payloads, without the
  // frame), together at most `max_pending_bytes`, at most `max_pending_per_peer` of them from
  // one peer (0 = DefaultPerPeer(max_pending); more than max_pending means max_pending).
  Inbox(size_t max_pending, size_t max_bytes, size_t max_pending_bytes = SIZE_MAX, size_t max_pending_per_peer = 0)
      : max_pending_(max_pending),
        max_bytes_(max_bytes),
        max_pending_bytes_(max_pending_bytes),
        max_pending_per_peer_(std::min(max_pending_per_peer == 0 ? DefaultPerPeer(max_pending) : max_pending_per_peer,
                                       max_pending)) {}

  // EngineOptions::max_pending_notifications_per_peer's default: a quarter of the backlog, so
  // that four peers that flood it leave room for the others, but at least kMinDefaultPerPeer
  // (all of a smaller backlog): a backlog that small is a peer's burst, not a share to split.
  static constexpr size_t kMinDefaultPerPeer = 64;
  static constexpr size_t DefaultPerPeer(size_t max_pending) {
    return std::max(max_pending / 4, std::min(max_pending, kMinDefaultPerPeer));
  }

  // Takes a received notification whose `message` is still framed (n.topic is ignored).
  // kInvalidArgument when the frame is malformed (counted in rejected()) or the payload too
  // big; kResourceExhausted when the backlog is full (by count or by bytes) or holds
  // max_pending_per_peer() notifications from n.from already (counted in dropped() and in
  // dropped_per_peer()).
  Status Push(Notification n) EXCLUDES(mu_) {
    if (!DecodeNotifyFrame(&n.message, &n.topic)) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kInvalidArgument, "malformed notification frame");
    }
    if (n.message.size() > max_bytes_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kInvalidArgument, "notification of " + std::to_string(n.message.size()) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(max_bytes_));
    }
    std::shared_ptr<const std::function<void()>> watcher;
    {
      MutexLock lock(&mu_);
      if (size_.load(std::memory_order_relaxed) >= max_pending_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return Status(Code::kResourceExhausted, "the receiver's notification backlog is full (" +
                                                    std::to_string(max_pending_) + " notifications)");
      }
      auto [peer, added] = per_peer_.try_emplace(n.from, 0);
      if (peer->second >= max_pending_per_peer_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        dropped_per_peer_.fetch_add(1, std::memory_order_relaxed);
        return Status(Code::kResourceExhausted, "the receiver holds " + std::to_string(peer->second) +
                                                    " undelivered notifications from this engine, its limit per peer");
      }
      if (n.message.size() > max_pending_bytes_ - pending_bytes_) {
        if (added) per_peer_.erase(peer);
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return Status(Code::kResourceExhausted, "the receiver's notification backlog is full (" +
                                                    std::to_string(pending_bytes_) + " of " +
                                                    std::to_string(max_pending_bytes_) + " bytes)");
      }
      pending_bytes_ += n.message.size();
      ++peer->second;
      if (!watchers_.empty()) {
        auto w = watchers_.find(n.topic);
        if (w != watchers_.end()) watcher = w->second;
      }
      std::deque<Notification>& queue = pending_[n.topic];
      queue.push_back(std::move(n));
      size_.fetch_add(1, std::memory_order_release);
    }
    if (watcher) (*watcher)();
    return Status::Ok();
  }

  // Runs `on_arrival` each time a notification of `topic` was taken in, on the thread that
  // pushed it, with no lock of the inbox held; an empty function removes the topic's watcher
  // (a call already under way on another thread may still finish after that).
  void Watch(std::string_view topic, std::function<void()> on_arrival) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (on_arrival) {
      watchers_[std::string(topic)] = std::make_shared<const std::function<void()>>(std::move(on_arrival));
    } else if (auto it = watchers_.find(topic); it != watchers_.end()) {
      watchers_.erase(it);
    }
  }

  // Takes every pending notification of `topic`, in arrival order.
  std::vector<Notification> PopAll(std::string_view topic = {}) EXCLUDES(mu_) {
    if (size_.load(std::memory_order_acquire) == 0) return {};
    MutexLock lock(&mu_);
    auto it = pending_.find(topic);
    if (it == pending_.end()) return {};
    std::vector<Notification> out(std::make_move_iterator(it->second.begin()),
                                  std::make_move_iterator(it->second.end()));
    pending_.erase(it);
    for (const Notification& n : out) {
      pending_bytes_ -= n.message.size();
      auto peer = per_peer_.find(n.from);
      if (peer != per_peer_.end() && --peer->second == 0) per_peer_.erase(peer);
    }
    size_.fetch_sub(out.size(), std::memory_order_release);
    return out;
  }

  // The largest message a transport carries into the inbox: the largest payload with the
  // longest frame.
  size_t max_bytes() const { return max_bytes_ + kNotifyFrameOverhead; }
  // The largest payload taken.
  size_t max_payload_bytes() const { return max_bytes_; }
  size_t max_pending() const { return max_pending_; }
  size_t max_pending_bytes() const { return max_pending_bytes_; }
  size_t max_pending_per_peer() const { return max_pending_per_peer_; }
  // Notifications refused since the inbox was made.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Of those, the ones refused because their peer had max_pending_per_peer() pending.
  uint64_t dropped_per_peer() const { return dropped_per_peer_.load(std::memory_order_relaxed); }
  // Messages dropped because their frame did not decode.
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

 private:
  const size_t max_pending_;
  const size_t max_bytes_;
  const size_t max_pending_bytes_;
  const size_t max_pending_per_peer_;
  Mutex mu_;
  // Topic -> its notifications; a topic with none is erased (a peer cannot grow the map past
  // the backlog's bound).
  std::map<std::string, std::deque<Notification>, std::less<>> pending_ GUARDED_BY(mu_);
  size_t pending_bytes_ GUARDED_BY(mu_) = 0;  // bytes of pending_'s payloads
  // Sending engine's key -> its notifications in pending_; a peer with none is erased (the map
  // holds at most max_pending_ entries).
  std::map<std::string, size_t, std::less<>> per_peer_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const std::function<void()>>, std::less<>> watchers_ GUARDED_BY(mu_);
  std::atomic<size_t> size_{0};  // notifications in pending_, written under mu_
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> dropped_per_peer_{0};
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace ferry::internal
