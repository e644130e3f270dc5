// The client's background threads: the reader of the service's replies (step errors, lost
// connections, step timeouts) and, in CUDA mode on rank 0, the sender of requests whose input
// copies are in flight on the runner's stream.
#include <string>

#include "embed/service/client_impl.h"

namespace ferry::embed::service {

void Client::Impl::Read() {
  for (;;) {
    Deadline until = Deadline::After(std::chrono::milliseconds(200));
    {
      MutexLock lock(&mu);
      for (auto& [seq, d] : waiting) until = Deadline::Earlier(until, d);
    }
    Result<Message> msg = Receive(fd.get(), until, wake_fd.get());
    if (!msg.ok() && msg.status().code() == Code::kCancelled) return;
    if (!msg.ok() && msg.status().code() == Code::kDeadlineExceeded) {
      MutexLock lock(&mu);
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (it->second.expired()) {
          SetFatal(Status(Code::kDeadlineExceeded,
                          "embedding step " + std::to_string(it->first) +
                              " got no reply from the service within the step timeout"));
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      if (!fatal.ok()) {
        FailAll();
        cv.NotifyAll();
        return;
      }
      continue;
    }
    Result<AnyMessage> decoded = msg.ok() ? Decode(msg->bytes) : Result<AnyMessage>(msg.status());
    MutexLock lock(&mu);
    if (!decoded.ok() || !std::holds_alternative<Reply>(*decoded)) {
      Status why =
          decoded.ok() ? Status(Code::kInvalidArgument, "unexpected message") : decoded.status();
      SetFatal(Status(Code::kUnavailable, "embedding service connection lost: " + why.ToString()));
      FailAll();
      cv.NotifyAll();
      return;
    }
    const Reply& r = std::get<Reply>(*decoded);
    waiting.erase(r.seq);
    if (!r.status.ok() && pending.ok())
      pending = r.status.WithContext("embedding step " + std::to_string(r.seq));
    cv.NotifyAll();
  }
}

Status Client::Impl::SendRequest(const Request& r) {
  {
    MutexLock lock(&mu);
    waiting[r.seq] = Deadline::After(options.step_timeout);
  }
  Status s = Send(fd.get(), Encode(r));
  if (s.ok()) return s;
  MutexLock lock(&mu);
  waiting.erase(r.seq);
  SetFatal(Status(Code::kUnavailable, "embedding service connection lost: " + s.ToString()));
  FailAll();
  cv.NotifyAll();
  return fatal;
}

void Client::Impl::SendLoop() {
  for (;;) {
    Pending p;
    {
      MutexLock lock(&mu);
      cv.Wait(&mu, [&]() REQUIRES(mu) { return closed || !to_send.empty(); });
      if (closed) return;
      p = to_send.front();
      to_send.pop_front();
    }
    (void)cuda::SetDevice(options.device);
    Status s = cuda::EventSync(p.event, Deadline::After(options.step_timeout));
    {
      MutexLock lock(&mu);
      free_events.push_back(p.event);
    }
    if (!s.ok()) {
      MutexLock lock(&mu);
      SetFatal(s.WithContext("the step's input copies"));
      FailAll();
      cv.NotifyAll();
      continue;
    }
    (void)SendRequest(p.request);
  }
}

}  // namespace ferry::embed::service
