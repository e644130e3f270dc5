// Conn: one control connection of the shm transport (see core.h): framed sends, calls awaiting
// replies with deadlines, the transfers riding on it, and the peer regions it has mapped.
#include <sys/socket.h>
#include <unistd.h>

#include "base/os.h"
#include "transport/shm/core.h"

namespace ferry::internal::shm {

Conn::~Conn() {
  if (fd_ >= 0) os::Env::Current()->Close(fd_);
}

void Conn::CloseSocket() {
  // A Send in progress ends at once: the socket was shut down when the connection failed.
  MutexLock send_lock(&send_mu_);
  MutexLock lock(&fd_mu_);
  if (fd_ < 0) return;
  os::Env::Current()->Close(fd_);
  fd_ = -1;
}

Status Conn::Send(const Header& h, std::string_view payload, std::span<const int> pass_fds) {
  if (failed()) return failure();
  std::string bytes = Encode(h, payload);
  MutexLock lock(&send_mu_);
  if (fd_ < 0) return failure();
  return Sent(os::SendMessage(fd_, bytes, pass_fds, Deadline::After(send_timeout_)));
}

Status Conn::TrySend(const Header& h) {
  if (failed()) return failure();
  Status s;
  {
    MutexLock lock(&fd_mu_);
    if (fd_ < 0) return failure();
    s = os::SendMessage(fd_, Encode(h), {}, Deadline::After(Clock::duration::zero()));
  }
  if (s.code() == Code::kDeadlineExceeded) return Status(Code::kResourceExhausted, "the peer's socket is full");
  return Sent(std::move(s));
}

Status Conn::Sent(Status s) {
  // kInvalidArgument: this message cannot go (too large, too many descriptors); the
  // connection is fine.
  if (s.ok() || s.code() == Code::kInvalidArgument) return s;
  Fail(s.WithContext("connection to " + peer_key_));
  return failure();
}

Status Conn::failure() const {
  MutexLock lock(&mu_);
  if (failure_.ok()) return Status(Code::kUnavailable, "connection to peer " + peer_key_ + " is closed");
  return failure_;
}

void Conn::Fail(Status why) {
  if (failed_.exchange(true, std::memory_order_acq_rel)) return;
  if (why.code() != Code::kAborted) why = Status(Code::kUnavailable, std::string(why.message()));
  std::unordered_map<uint64_t, Waiting> calls;
  std::vector<std::weak_ptr<TransferState>> tracked;
  std::unordered_map<uint64_t, std::shared_ptr<MappingSlot>> slots;
  {
    MutexLock lock(&mu_);
    failure_ = why;
    calls.swap(calls_);
    tracked.swap(tracked_);
    slots.swap(slots_);
  }
  {
    MutexLock lock(&fd_mu_);
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);  // the I/O thread sees the hang-up and drops the connection
  }
  ring_cv_.NotifyAll();
  for (auto& [token, w] : calls) w.reply(why, Header{}, -1, -1);
  for (auto& weak : tracked)
    if (auto s = weak.lock()) s->Finish(why);
  // Transfers already copying finish into the mapping, which lives until they let go.
  for (auto& [region, slot] : slots) slot->Revoke(nullptr);
}

Status Conn::Call(const Header& h, std::string_view payload, Deadline deadline, ReplyFn reply) {
  Header out = h;
  {
    MutexLock lock(&mu_);
    if (failed()) return failure_.ok() ? Status(Code::kUnavailable, "connection closed") : failure_;
    out.token = next_token_++;
    calls_[out.token] = Waiting{std::move(reply), deadline};
  }
  Status s = Send(out, payload);
  if (!s.ok()) {
    MutexLock lock(&mu_);
    // A failed send fails the connection, whose Fail() may have answered the call already:
    // then `reply` ran, and the caller must not complete it a second time.
    if (calls_.erase(out.token) == 0) return Status::Ok();
    return s;
  }
  return Status::Ok();
}

bool Conn::Complete(uint64_t token, const Status& s, const Header& h, int region_fd, int table_fd) {
  Waiting w;
  {
    MutexLock lock(&mu_);
    auto it = calls_.find(token);
    if (it == calls_.end()) return false;
    w = std::move(it->second);
    calls_.erase(it);
  }
  w.reply(s, h, region_fd, table_fd);
  return true;
}

void Conn::ExpireCalls() {
  std::vector<Waiting> expired;
  {
    MutexLock lock(&mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second.deadline.expired()) {
        expired.push_back(std::move(it->second));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
    // Forget transfers that finished.
    if (tracked_.size() > 64) {
      std::erase_if(tracked_, [](const std::weak_ptr<TransferState>& w) {
        auto s = w.lock();
        return !s || s->finished();
      });
    }
  }
  for (auto& w : expired)
    w.reply(Status(Code::kDeadlineExceeded, "peer " + peer_key_ + " did not answer in time"), Header{}, -1, -1);
}

void Conn::Track(const std::shared_ptr<TransferState>& state) {
  MutexLock lock(&mu_);
  if (failed()) {
    state->Finish(failure_);
    return;
  }
  tracked_.push_back(state);
}

std::shared_ptr<MappingSlot> Conn::FindSlot(uint64_t region) {
  MutexLock lock(&mu_);
  auto it = slots_.find(region);
  return it == slots_.end() ? nullptr : it->second;
}

std::shared_ptr<MappingSlot> Conn::InstallSlot(uint64_t region, std::shared_ptr<MappingSlot> slot) {
  MutexLock lock(&mu_);
  auto& place = slots_[region];
  if (place && place->live()) return place;
  place = std::move(slot);
  return place;
}

Result<std::shared_ptr<const RevocationView>> Conn::View(int table_fd) {
  MutexLock lock(&mu_);
  if (!view_) {
    auto v = RevocationView::Map(table_fd);
    os::Env::Current()->Close(table_fd);
    if (!v.ok()) return v.status();
    view_ = std::move(v).value();
  } else {
    os::Env::Current()->Close(table_fd);
  }
  return view_;
}

bool Conn::SetRing(Result<std::unique_ptr<RingWriter>> ring) {
  {
    MutexLock lock(&mu_);
    if (ring_set_) return false;
    ring_set_ = true;
    if (ring.ok()) {
      ring_ = std::move(ring).value();
      ring_ptr_.store(ring_.get(), std::memory_order_release);
    } else {
      ring_status_ = Status(Code::kUnavailable, "no notification ring to peer " + peer_key_ + ": " +
                                                    std::string(ring.status().message()));
    }
  }
  ring_cv_.NotifyAll();
  return true;
}

Result<RingWriter*> Conn::Ring(Deadline until) {
  if (RingWriter* r = ring_ptr_.load(std::memory_order_acquire)) return r;  // no lock once set
  MutexLock lock(&mu_);
  if (!ring_cv_.WaitUntil(&mu_, until.at(), [&]() REQUIRES(mu_) { return ring_set_ || failed(); }))
    return Status(Code::kDeadlineExceeded, "peer " + peer_key_ + " did not set up notifications in time");
  if (failed()) return failure_.ok() ? Status(Code::kUnavailable, "connection closed") : failure_;
  if (!ring_) return ring_status_;
  return ring_.get();
}

Result<uint64_t> Conn::Expect(Deadline deadline, ReplyFn reply) {
  MutexLock lock(&mu_);
  if (failed()) return failure_.ok() ? Status(Code::kUnavailable, "connection closed") : failure_;
  const uint64_t token = next_token_++;
  calls_[token] = Waiting{std::move(reply), deadline};
  return token;
}

bool Conn::Forget(uint64_t token) {
  MutexLock lock(&mu_);
  return calls_.erase(token) != 0;
}

void Conn::WakePeer() {
  Header h;
  h.type = MsgType::kWake;
  // Without waiting: a full socket holds messages enough to wake the peer anyway, and a peer
  // that is gone is noticed by the I/O thread.
  MutexLock lock(&fd_mu_);
  if (fd_ >= 0) (void)os::SendMessage(fd_, Encode(h), {}, Deadline::After(Clock::duration::zero()));
}

void Conn::RevokeSlot(uint64_t region) {
  std::shared_ptr<MappingSlot> slot;
  {
    MutexLock lock(&mu_);
    auto it = slots_.find(region);
    if (it != slots_.end()) {
      slot = std::move(it->second);
      slots_.erase(it);
    }
  }
  Header h;
  h.type = MsgType::kUnmapped;
  h.region = region;
  auto tell = [weak = self_, h] {
    if (auto c = weak.lock()) (void)c->Send(h);
  };
  if (!slot || !slot->Revoke(tell)) tell();  // nothing mapped: answer at once
}

}  // namespace ferry::internal::shm
