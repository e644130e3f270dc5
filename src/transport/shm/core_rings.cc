// Core's target side of the notification rings (see core.h and ring.h): making a ring for each
// connection that says hello, draining the rings into the inbox (from the I/O thread and from
// Poll), and asking to be woken before the I/O thread sleeps.
#include <algorithm>

#include "base/log.h"
#include "transport/shm/core.h"

namespace ferry::internal::shm {
namespace {

// The I/O thread wakes at least this often to expire calls past their deadline.
constexpr int kPollMs = 50;
// While application threads poll the rings, the I/O thread looks every millisecond instead of
// asking to be woken: the receiver then pays no syscall per message, and when the application
// stops polling, what arrives meanwhile waits at most this long.
constexpr int kPolledMs = 1;
// Records taken from one ring in one go.
constexpr size_t kMaxTake = 4096;

}  // namespace

void Core::OfferRing(const std::shared_ptr<Conn>& conn) {
  Header reply;
  reply.type = MsgType::kRing;
  auto reader = RingReader::Create(RingCapacityFor(max_notification_bytes_, inbox_->max_pending()),
                                   std::min(max_notification_bytes_, inbox_->max_bytes()));
  if (!reader.ok()) {
    FERRY_LOG_WARN("shm: no notification ring for {}: {}", conn->peer_key(), reader.status().ToString());
    reply.code = static_cast<uint8_t>(Code::kUnavailable);
    (void)conn->Send(reply);
    return;
  }
  reply.size = (*reader)->capacity();
  reply.offset = (*reader)->max_message_bytes();
  const int fd = (*reader)->fd();
  {
    MutexLock lock(&drain_mu_);
    rings_.push_back(RingEntry{conn, conn->peer_key(), std::move(reader).value()});
  }
  (void)conn->Send(reply, {}, std::span<const int>(&fd, 1));  // the reader keeps its file open
}

void Core::DrainRing(RingEntry& e, AfterDrain* after) {
  RingTake take = e.reader->Take(kMaxTake);
  for (RingRecord& r : take.records) {
    Status s = inbox_->Push(Notification{e.peer_key, std::move(r.message)});
    if (r.acked) after->acks.push_back({e.conn, r.token, s.code()});
  }
  if (!take.error.ok()) {
    Reject("from " + e.peer_key + ": " + std::string(take.error.message()));
    after->broken.push_back(e.conn);
  }
}

bool Core::DrainLocked(AfterDrain* after) {
  bool any = false;
  for (RingEntry& e : rings_) {
    if (!e.reader->Pending()) continue;
    any = true;
    DrainRing(e, after);
  }
  return any;
}

void Core::Finish(AfterDrain& after, bool may_wait) {
  bool deferred = false;
  for (auto& a : after.acks) {
    Header ack;
    ack.type = MsgType::kAck;
    ack.token = a.token;
    ack.code = static_cast<uint8_t>(a.code);
    if (may_wait) {
      (void)a.conn->Send(ack);
    } else if (a.conn->TrySend(ack).code() == Code::kResourceExhausted) {
      MutexLock lock(&deferred_mu_);
      deferred_acks_.push_back(std::move(a));
      deferred = true;
    }
  }
  if (deferred) Wake();
  for (auto& c : after.broken) c->Fail(Status(Code::kUnavailable, "the peer corrupted its notification ring"));
}

bool Core::Poll() {
  poll_calls_.fetch_add(1, std::memory_order_relaxed);
  AfterDrain after;
  bool any;
  {
    MutexLock lock(&drain_mu_);
    any = DrainLocked(&after);
  }
  if (any) Finish(after, /*may_wait=*/false);
  return any;
}

int Core::PrepareToSleep() {
  const uint64_t calls = poll_calls_.load(std::memory_order_relaxed);
  const bool polled = calls != poll_calls_seen_;
  poll_calls_seen_ = calls;
  AfterDrain after;
  {
    // Acks that application threads could not send at once.
    MutexLock lock(&deferred_mu_);
    after.acks.swap(deferred_acks_);
  }
  int timeout = polled ? kPolledMs : kPollMs;
  {
    MutexLock lock(&drain_mu_);
    for (RingEntry& e : rings_) e.reader->Disarm();
    DrainLocked(&after);
    if (!polled) {
      // Set `waiting` on every ring, then look once more: a record published before the sender
      // could see the word set is seen here (ring.h).
      for (RingEntry& e : rings_)
        if (e.reader->Arm()) timeout = 0;
    }
  }
  Finish(after, /*may_wait=*/true);
  return timeout;
}

void Core::DropRing(const std::shared_ptr<Conn>& conn) {
  AfterDrain after;
  std::unique_ptr<RingReader> gone;
  {
    MutexLock lock(&drain_mu_);
    auto it = std::find_if(rings_.begin(), rings_.end(), [&](const RingEntry& e) { return e.conn == conn; });
    if (it == rings_.end()) return;
    // What the peer published before it went is delivered.
    if (it->reader->Pending()) DrainRing(*it, &after);
    gone = std::move(it->reader);
    rings_.erase(it);
  }
  after.acks.clear();  // the connection is gone
  after.broken.clear();
}

}  // namespace ferry::internal::shm
